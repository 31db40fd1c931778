-- controltable: DDL and statements for oracle (server version 19.0)
-- Run the DDL once with DDL rights (or `controltable init`); afterwards the engine needs DML only
-- (SELECT, INSERT, UPDATE, DELETE on the tables below and on your event tables).

-- ===== control tables =====
CREATE TABLE ct_meta (
	key VARCHAR2(64 CHAR) NOT NULL, 
	value VARCHAR2(255 CHAR) NOT NULL, 
	PRIMARY KEY (key)
);
CREATE TABLE ct_request (
	id NUMBER(19) NOT NULL, 
	namespace VARCHAR2(100 CHAR) NOT NULL, 
	"resource" VARCHAR2(200 CHAR) NOT NULL, 
	holder VARCHAR2(200 CHAR) NOT NULL, 
	request_key VARCHAR2(64 CHAR) NOT NULL, 
	slots INTEGER NOT NULL, 
	"mode" VARCHAR2(10 CHAR) NOT NULL, 
	state VARCHAR2(10 CHAR) NOT NULL, 
	token NUMBER(19), 
	lease_seconds BINARY_DOUBLE NOT NULL, 
	enqueued_at BINARY_DOUBLE NOT NULL, 
	granted_at BINARY_DOUBLE, 
	expires_at BINARY_DOUBLE NOT NULL, 
	PRIMARY KEY (id), 
	CONSTRAINT ct_request_holder_uq UNIQUE (namespace, "resource", holder)
);
CREATE INDEX ct_request_key_ix ON ct_request (request_key);
CREATE INDEX ct_request_queue_ix ON ct_request (namespace, "resource", id);
CREATE TABLE ct_resource (
	namespace VARCHAR2(100 CHAR) NOT NULL, 
	name VARCHAR2(200 CHAR) NOT NULL, 
	capacity INTEGER NOT NULL, 
	last_token NUMBER(19) NOT NULL, 
	created_at BINARY_DOUBLE NOT NULL, 
	CONSTRAINT ct_resource_pk PRIMARY KEY (namespace, name)
);
CREATE TABLE ct_work_item (
	id NUMBER(19) NOT NULL, 
	namespace VARCHAR2(100 CHAR) NOT NULL, 
	worklist VARCHAR2(200 CHAR) NOT NULL, 
	exec_order INTEGER NOT NULL, 
	priority INTEGER NOT NULL, 
	payload CLOB NOT NULL, 
	state VARCHAR2(10 CHAR) NOT NULL, 
	owner VARCHAR2(200 CHAR), 
	token NUMBER(19), 
	attempts INTEGER NOT NULL, 
	last_error CLOB, 
	created_at BINARY_DOUBLE NOT NULL, 
	started_at BINARY_DOUBLE, 
	finished_at BINARY_DOUBLE, 
	expires_at BINARY_DOUBLE, 
	PRIMARY KEY (id)
);
CREATE INDEX ct_work_item_ix ON ct_work_item (namespace, worklist, state, exec_order);
CREATE TABLE ct_worklist (
	namespace VARCHAR2(100 CHAR) NOT NULL, 
	name VARCHAR2(200 CHAR) NOT NULL, 
	last_token NUMBER(19) NOT NULL, 
	created_at BINARY_DOUBLE NOT NULL, 
	CONSTRAINT ct_worklist_pk PRIMARY KEY (namespace, name)
);

-- ===== set_capacity (create or resize a resource) =====
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1 FOR UPDATE;
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at) VALUES (:namespace, :name, :capacity, :last_token, (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))));

-- ===== acquire: lock the resource row, reap expired entries, read the queue, grant =====
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token 
FROM ct_resource 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1 FOR UPDATE;
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS now, ct_request.id, ct_request."resource", ct_request.holder, ct_request.request_key, ct_request.slots, ct_request."mode", ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at 
FROM ct_resource LEFT OUTER JOIN ct_request ON ct_request.namespace = ct_resource.namespace AND ct_request."resource" = ct_resource.name 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name IN (:name_1_1) ORDER BY ct_request.id;
UPDATE ct_resource SET last_token=:last_token WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1;
INSERT INTO ct_request (namespace, "resource", holder, request_key, slots, "mode", state, token, lease_seconds, enqueued_at, granted_at, expires_at) VALUES (:namespace, :"resource", :holder, :request_key, :slots, :"mode", :state, :token, :lease_seconds, :enqueued_at, :granted_at, :expires_at) RETURNING ct_request.id INTO :ret_0;

-- ===== try_acquire while held: enqueue or refresh a waiter =====
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token 
FROM ct_resource 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1 FOR UPDATE;
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS now, ct_request.id, ct_request."resource", ct_request.holder, ct_request.request_key, ct_request.slots, ct_request."mode", ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at 
FROM ct_resource LEFT OUTER JOIN ct_request ON ct_request.namespace = ct_resource.namespace AND ct_request."resource" = ct_resource.name 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name IN (:name_1_1) ORDER BY ct_request.id;
INSERT INTO ct_request (namespace, "resource", holder, request_key, slots, "mode", state, lease_seconds, enqueued_at, expires_at) VALUES (:namespace, :"resource", :holder, :request_key, :slots, :"mode", :state, :lease_seconds, :enqueued_at, :expires_at) RETURNING ct_request.id INTO :ret_0;

-- ===== renew a lease (fenced by the request key) =====
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS db_now_1 FROM DUAL;
UPDATE ct_request SET lease_seconds=:lease_seconds, expires_at=:expires_at WHERE ct_request.request_key = :request_key_1 AND ct_request.state = 'granted' AND ct_request.expires_at >= :expires_at_1;

-- ===== release a lease =====
DELETE FROM ct_request WHERE ct_request.request_key = :request_key_1;

-- ===== status =====
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS db_now_1 FROM DUAL;
SELECT ct_resource.namespace, ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.created_at 
FROM ct_resource 
WHERE ct_resource.namespace = :namespace_1 ORDER BY ct_resource.name;
SELECT ct_request.id, ct_request.namespace, ct_request."resource", ct_request.holder, ct_request.request_key, ct_request.slots, ct_request."mode", ct_request.state, ct_request.token, ct_request.lease_seconds, ct_request.enqueued_at, ct_request.granted_at, ct_request.expires_at 
FROM ct_request 
WHERE ct_request.namespace = :namespace_1 ORDER BY ct_request.id;

-- ===== reap expired holders and waiters =====
DELETE FROM ct_request WHERE ct_request.namespace = :namespace_1 AND ct_request.expires_at < (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')));

-- ===== events prepare (introspection) =====

-- ===== events prepare: claim columns, claim indexes, statistics (DDL) =====
-- each statement runs in a transaction of its own, after a lock timeout for DDL
-- (Oracle DDL_LOCK_TIMEOUT, PostgreSQL lock_timeout, MySQL lock_wait_timeout, SQL Server LOCK_TIMEOUT);
-- indexes are built online where the server offers it (PostgreSQL CONCURRENTLY, SQL Server and
-- Oracle Enterprise Edition: WITH (ONLINE = ON) / ONLINE appended to CREATE INDEX).
ALTER TABLE events ADD ct_state SMALLINT DEFAULT '0' NOT NULL;
ALTER TABLE events ADD ct_owner VARCHAR2(200 CHAR);
ALTER TABLE events ADD ct_token NUMBER(19);
ALTER TABLE events ADD ct_expires_at BINARY_DOUBLE;
ALTER TABLE events ADD ct_available_at BINARY_DOUBLE;
ALTER TABLE events ADD ct_attempts INTEGER DEFAULT '0' NOT NULL;
ALTER TABLE events ADD ct_error VARCHAR2(4000 BYTE);
ALTER TABLE events ADD ct_done_at BINARY_DOUBLE;
CREATE INDEX ct_claim_events ON events (ct_state, event_id);
BEGIN DBMS_STATS.GATHER_TABLE_STATS(ownname => USER, tabname => '"EVENTS"', cascade => TRUE); END;
/

-- ===== events claim: one short transaction that skips rows other workers hold =====
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS db_now_1 FROM DUAL;
SELECT /*+ FIRST_ROWS(5) */ events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < :ct_expires_at_1 ORDER BY events.event_id FOR UPDATE SKIP LOCKED;
SELECT /*+ FIRST_ROWS(5) */ events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= :ct_available_at_1) ORDER BY events.event_id FOR UPDATE SKIP LOCKED;
UPDATE events SET ct_state=:ct_state, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_attempts=(events.ct_attempts + :ct_attempts_1) WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5);

-- ===== batch complete (fenced on the batch token) =====
UPDATE events SET ct_state=:ct_state, ct_expires_at=:ct_expires_at, ct_error=:ct_error, ct_done_at=(EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) WHERE events.ct_token = :ct_token_1 AND events.ct_state = 1;

-- ===== batch fail (back-off or error state, decided from the stored attempts) =====
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS db_now_1 FROM DUAL;
SELECT /*+ FIRST_ROWS(5) */ events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < :ct_expires_at_1 ORDER BY events.event_id FOR UPDATE SKIP LOCKED;
SELECT /*+ FIRST_ROWS(5) */ events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= :ct_available_at_1) ORDER BY events.event_id FOR UPDATE SKIP LOCKED;
UPDATE events SET ct_state=:ct_state, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_attempts=(events.ct_attempts + :ct_attempts_1) WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5);
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5) AND events.ct_token = :ct_token_1 AND events.ct_state = 1 FOR UPDATE;
UPDATE events SET ct_state=CASE WHEN (events.ct_attempts >= :ct_attempts_1) THEN :param_1 ELSE :param_2 END, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_available_at=CASE WHEN (events.ct_attempts >= :ct_attempts_1) THEN NULL WHEN (events.ct_attempts <= :ct_attempts_2) THEN (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) + :param_3 WHEN (events.ct_attempts <= :ct_attempts_3) THEN (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) + :param_4 WHEN (events.ct_attempts <= :ct_attempts_4) THEN (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) + :param_5 WHEN (events.ct_attempts <= :ct_attempts_5) THEN (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) + :param_6 ELSE (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) + :param_7 END, ct_error=:ct_error WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5) AND events.ct_token = :ct_token_1 AND events.ct_state = 1;

-- ===== batch renew and release =====
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS db_now_1 FROM DUAL;
SELECT /*+ FIRST_ROWS(2) */ events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < :ct_expires_at_1 ORDER BY events.event_id FOR UPDATE SKIP LOCKED;
SELECT /*+ FIRST_ROWS(2) */ events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= :ct_available_at_1) ORDER BY events.event_id FOR UPDATE SKIP LOCKED;
UPDATE events SET ct_state=:ct_state, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_attempts=(events.ct_attempts + :ct_attempts_1) WHERE events.event_id IN (:event_id_1_1, :event_id_1_2);
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_token = :ct_token_1 AND events.ct_state = 1 AND events.ct_expires_at >= :ct_expires_at_1 FOR UPDATE;
UPDATE events SET ct_expires_at=:ct_expires_at WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_token = :ct_token_1 AND events.ct_state = 1;
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_token = :ct_token_1 AND events.ct_state = 1 FOR UPDATE;
UPDATE events SET ct_state=:ct_state, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_attempts=CASE WHEN (events.ct_attempts > :ct_attempts_1) THEN events.ct_attempts - :ct_attempts_2 ELSE :param_1 END WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_token = :ct_token_1 AND events.ct_state = 1;

-- ===== events stats =====
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS db_now_1 FROM DUAL;
SELECT events.ct_state, count(*) AS count_1 
FROM events GROUP BY events.ct_state;
SELECT count(*) AS count_1 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < :ct_expires_at_1;
SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 ORDER BY events.event_id
 FETCH FIRST 1 ROWS ONLY;

-- ===== events retry_errors =====
UPDATE events SET ct_state=:ct_state, ct_available_at=:ct_available_at, ct_attempts=:ct_attempts, ct_error=:ct_error WHERE events.ct_state = 3;

-- ===== worklist populate =====
SELECT ct_worklist.last_token 
FROM ct_worklist 
WHERE ct_worklist.namespace = :namespace_1 AND ct_worklist.name = :name_1 FOR UPDATE;
INSERT INTO ct_worklist (namespace, name, last_token, created_at) VALUES (:namespace, :name, :last_token, (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))));
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS db_now_1 FROM DUAL;
INSERT INTO ct_work_item (namespace, worklist, exec_order, priority, payload, state, attempts, created_at) VALUES (:namespace, :worklist, :exec_order, :priority, :payload, :state, :attempts, :created_at) RETURNING ct_work_item.id INTO :ret_0;

-- ===== worklist allocate: lock the work list row, lowest unfinished order only =====
SELECT ct_worklist.last_token 
FROM ct_worklist 
WHERE ct_worklist.namespace = :namespace_1 AND ct_worklist.name = :name_1 FOR UPDATE;
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS db_now_1 FROM DUAL;
SELECT min(ct_work_item.exec_order) AS min_1 
FROM ct_work_item 
WHERE ct_work_item.namespace = :namespace_1 AND ct_work_item.worklist = :worklist_1 AND ct_work_item.state IN ('new', 'active', 'error');
SELECT ct_work_item.id, ct_work_item.payload, ct_work_item.exec_order, ct_work_item.priority, ct_work_item.attempts 
FROM ct_work_item 
WHERE ct_work_item.namespace = :namespace_1 AND ct_work_item.worklist = :worklist_1 AND ct_work_item.exec_order = :exec_order_1 AND (ct_work_item.state = 'new' OR ct_work_item.state = 'active' AND ct_work_item.expires_at < :expires_at_1) ORDER BY ct_work_item.priority DESC, ct_work_item.id
 FETCH FIRST 1 ROWS ONLY;
UPDATE ct_worklist SET last_token=:last_token WHERE ct_worklist.namespace = :namespace_1 AND ct_worklist.name = :name_1;
UPDATE ct_work_item SET state=:state, owner=:owner, token=:token, attempts=(ct_work_item.attempts + :attempts_1), started_at=:started_at, finished_at=:finished_at, expires_at=:expires_at WHERE ct_work_item.id = :id_1;

-- ===== work item complete (fenced on the item token) =====
UPDATE ct_work_item SET state=:state, last_error=:last_error, finished_at=(EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))), expires_at=:expires_at WHERE ct_work_item.id = :id_1 AND ct_work_item.token = :token_1 AND ct_work_item.state = 'active';

-- ===== worklist status =====
SELECT (EXTRACT(DAY FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 86400 + EXTRACT(HOUR FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 3600 + EXTRACT(MINUTE FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00')) * 60 + EXTRACT(SECOND FROM (SYS_EXTRACT_UTC(SYSTIMESTAMP) - TIMESTAMP '1970-01-01 00:00:00'))) AS db_now_1 FROM DUAL;
SELECT ct_work_item.exec_order, ct_work_item.state, count(*) AS count_1, sum(CASE WHEN (ct_work_item.state = 'active' AND ct_work_item.expires_at < :expires_at_1) THEN :param_2 ELSE :param_3 END) AS sum_1 
FROM ct_work_item 
WHERE ct_work_item.namespace = :namespace_1 AND ct_work_item.worklist = :worklist_1 GROUP BY ct_work_item.exec_order, ct_work_item.state ORDER BY ct_work_item.exec_order;
