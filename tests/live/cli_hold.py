"""The work ``controltable run`` starts in the cross-orchestrator test: it records its own hold interval.

``python cli_hold.py RECORDS NAME SECONDS``: works ``SECONDS`` and writes ``RECORDS/held_NAME.json``
with the token and holder ``run`` passed it (CONTROLTABLE_TOKEN, CONTROLTABLE_HOLDER) and the
interval it worked, measured inside the hold, as the Dagster and Prefect work record theirs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    records, name, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    start = time.time()
    time.sleep(seconds)  # the pretend work
    end = time.time()
    record = {"holder": os.environ["CONTROLTABLE_HOLDER"], "token": int(os.environ["CONTROLTABLE_TOKEN"]),
              "pid": os.getpid(), "start": start, "end": end}
    tmp = records / f".{name}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.rename(records / f"held_{name}.json")  # whole or absent: the test never reads half a record


if __name__ == "__main__":
    main()
