-- controltable: DDL and statements for sqlite (server version 3.40)
-- Run the DDL once with DDL rights (or `controltable init`); afterwards the engine needs DML only
-- (SELECT, INSERT, UPDATE, DELETE on the tables below and on your event tables).
-- Each statement the engine sends is printed under the name of its builder (`-- name: claim_select`:
-- the function or method of controltable's statements modules, or the function that sent it), with
-- a `-- sqlite: ...` line where it is shaped differently on sqlite for a reason.

-- ===== control tables =====
CREATE TABLE ct_grant_history (
	namespace VARCHAR(100) NOT NULL, 
	resource VARCHAR(200) NOT NULL, 
	token BIGINT NOT NULL, 
	holder VARCHAR(200) NOT NULL, 
	mode VARCHAR(10) NOT NULL, 
	slots INTEGER NOT NULL, 
	priority INTEGER NOT NULL, 
	enqueued_at FLOAT NOT NULL, 
	granted_at FLOAT NOT NULL, 
	ended_at FLOAT, 
	outcome VARCHAR(10) NOT NULL, 
	CONSTRAINT ct_grant_history_pk PRIMARY KEY (namespace, resource, token)
);
CREATE INDEX ct_grant_history_time_ix ON ct_grant_history (namespace, resource, granted_at);
CREATE TABLE ct_meta (
	"key" VARCHAR(64) NOT NULL, 
	value VARCHAR(255) NOT NULL, 
	PRIMARY KEY ("key")
);
CREATE TABLE ct_request (
	id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, 
	namespace VARCHAR(100) NOT NULL, 
	resource VARCHAR(200) NOT NULL, 
	holder VARCHAR(200) NOT NULL, 
	request_key VARCHAR(64) NOT NULL, 
	slots INTEGER NOT NULL, 
	mode VARCHAR(10) NOT NULL, 
	state VARCHAR(10) NOT NULL, 
	token BIGINT, 
	lease_seconds FLOAT NOT NULL, 
	enqueued_at FLOAT NOT NULL, 
	granted_at FLOAT, 
	expires_at FLOAT NOT NULL, 
	ticket BIGINT DEFAULT 0 NOT NULL, 
	attempt INTEGER, 
	pickup_seconds FLOAT, 
	priority INTEGER DEFAULT 0 NOT NULL, 
	queue_key FLOAT DEFAULT 0 NOT NULL, 
	CONSTRAINT ct_request_holder_uq UNIQUE (namespace, resource, holder)
);
CREATE INDEX ct_request_key_ix ON ct_request (request_key);
CREATE INDEX ct_request_order_ix ON ct_request (namespace, resource, state, queue_key, ticket);
CREATE TABLE ct_resource (
	namespace VARCHAR(100) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	capacity INTEGER NOT NULL, 
	last_token BIGINT NOT NULL, 
	created_at FLOAT NOT NULL, 
	last_ticket BIGINT DEFAULT 0 NOT NULL, 
	rate_count INTEGER, 
	rate_per FLOAT, 
	aging FLOAT, 
	CONSTRAINT ct_resource_pk PRIMARY KEY (namespace, name)
);
CREATE TABLE ct_work_item (
	id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, 
	namespace VARCHAR(100) NOT NULL, 
	worklist VARCHAR(200) NOT NULL, 
	exec_order INTEGER NOT NULL, 
	priority INTEGER NOT NULL, 
	payload TEXT NOT NULL, 
	state VARCHAR(10) NOT NULL, 
	owner VARCHAR(200), 
	token BIGINT, 
	attempts INTEGER NOT NULL, 
	last_error TEXT, 
	created_at FLOAT NOT NULL, 
	started_at FLOAT, 
	finished_at FLOAT, 
	expires_at FLOAT
);
CREATE INDEX ct_work_item_next_ix ON ct_work_item (namespace, worklist, state, exec_order, priority DESC, id);
CREATE TABLE ct_worklist (
	namespace VARCHAR(100) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	last_token BIGINT NOT NULL, 
	created_at FLOAT NOT NULL, 
	CONSTRAINT ct_worklist_pk PRIMARY KEY (namespace, name)
);

-- ===== set_capacity: lock or create the resource row, then a grant pass (more capacity may admit waiters) =====
-- name: lock_resource_name
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: create_resource
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at, last_ticket) VALUES (?, ?, ?, ?, ((julianday('now') - 2440587.5) * 86400.0), ?);
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch, ((julianday('now') - 2440587.5) * 86400.0) AS now 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: change_resource
UPDATE ct_resource SET capacity=? WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?) AS anon_1;

-- ===== acquire: lock the resource rows, enqueue under the next ticket, grant pass over holders and head =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch, ((julianday('now') - 2440587.5) * 86400.0) AS now 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.holder = ?;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?) AS anon_1;
-- name: grant_waiter
UPDATE ct_request SET state=?, token=?, lease_seconds=?, granted_at=?, expires_at=? WHERE ct_request.id = ? AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
-- name: write_counters
UPDATE ct_resource SET last_token=?, last_ticket=? WHERE ct_resource.namespace = ? AND ct_resource.name = ?;

-- ===== try_acquire while held: read its own entry without locks, then enqueue as a waiter (ticketed FIFO) =====
-- name: peek
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key, ((julianday('now') - 2440587.5) * 86400.0) AS now, (SELECT wq.ticket 
FROM ct_request AS wq 
WHERE wq.namespace = ct_request.namespace AND wq.resource = ct_request.resource AND wq.state = 'waiting' AND wq.expires_at >= ((julianday('now') - 2440587.5) * 86400.0) ORDER BY wq.queue_key, wq.ticket
 LIMIT ? OFFSET ?) AS head_ticket, (SELECT min(hq.expires_at) AS min_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS hold_exp, (SELECT coalesce(sum(hq.slots), ?) AS coalesce_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS used, (SELECT count(*) AS count_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted' AND hq.mode = ?) AS excl, ct_resource.capacity, ct_resource.rate_count, ct_resource.rate_per 
FROM ct_request JOIN ct_resource ON ct_resource.namespace = ct_request.namespace AND ct_resource.name = ct_request.resource 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.holder = ?;
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch, ((julianday('now') - 2440587.5) * 86400.0) AS now 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.holder = ?;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?) AS anon_1;
-- name: write_counters
UPDATE ct_resource SET last_token=?, last_ticket=? WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: head_ticket
SELECT ct_request.ticket 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' AND ct_request.expires_at >= ((julianday('now') - 2440587.5) * 86400.0) ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?;

-- ===== renew a lease: extend on the database clock while granted and unexpired (fenced by key and attempt) =====
-- name: read_now
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS db_now_1;
-- name: extend_lease
UPDATE ct_request SET lease_seconds=?, expires_at=? WHERE ct_request.request_key = ? AND ct_request.attempt IS ? AND ct_request.state = 'granted' AND ct_request.expires_at >= ?;

-- ===== release a lease: lock the resource row, delete the entry, grant pass for the next in line =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch, ((julianday('now') - 2440587.5) * 86400.0) AS now 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: delete_request_rows
DELETE FROM ct_request WHERE ct_request.request_key = ? AND ct_request.attempt IS ? RETURNING id, resource, state, token, expires_at;
-- name: end_grant
UPDATE ct_grant_history SET ended_at=?, outcome=? WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource = ? AND ct_grant_history.token = ? AND ct_grant_history.outcome = 'held';
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?) AS anon_1;
-- name: grant_waiter
UPDATE ct_request SET state=?, token=?, granted_at=?, expires_at=? WHERE ct_request.id = ? AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
-- name: write_counters
UPDATE ct_resource SET last_token=?, last_ticket=? WHERE ct_resource.namespace = ? AND ct_resource.name = ?;

-- ===== release a grant released already (another lease of it): the grant history says how it ended =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch, ((julianday('now') - 2440587.5) * 86400.0) AS now 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: delete_request_rows
DELETE FROM ct_request WHERE ct_request.request_key = ? AND ct_request.attempt IS ? RETURNING id, resource, state, token, expires_at;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?) AS anon_1;
-- name: grant_outcomes
SELECT ct_grant_history.resource, ct_grant_history.token, ct_grant_history.outcome 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource IN (?) AND ct_grant_history.token IN (?);

-- ===== status: resources, holders and waiters (no locks) =====
-- name: read_now
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS db_now_1;
-- name: resources
SELECT ct_resource.namespace, ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.created_at, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging 
FROM ct_resource 
WHERE ct_resource.namespace = ? ORDER BY ct_resource.name;
-- name: requests
SELECT ct_request.id, ct_request.namespace, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.lease_seconds, ct_request.enqueued_at, ct_request.granted_at, ct_request.expires_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.priority, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? ORDER BY ct_request.resource, ct_request.ticket;

-- ===== reap: resources with entries expired on the database clock (each then reaped under its lock) =====
-- name: expired_resources
SELECT DISTINCT ct_request.resource 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.expires_at < ((julianday('now') - 2440587.5) * 86400.0);

-- ===== expiry: an expired holder or waiter is deleted with its expiry re-checked (on SQL Server the DELETE returns the ids it removed: the row count is never trusted) =====
-- name: lock_resource_name
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: create_resource
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at, last_ticket) VALUES (?, ?, ?, ?, ((julianday('now') - 2440587.5) * 86400.0), ?);
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch, ((julianday('now') - 2440587.5) * 86400.0) AS now 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: change_resource
UPDATE ct_resource SET capacity=? WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?) AS anon_1;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.holder = ?;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
-- name: grant_waiter
UPDATE ct_request SET state=?, token=?, lease_seconds=?, granted_at=?, expires_at=? WHERE ct_request.id = ? AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
-- name: write_counters
UPDATE ct_resource SET last_token=?, last_ticket=? WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: peek
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key, ((julianday('now') - 2440587.5) * 86400.0) AS now, (SELECT wq.ticket 
FROM ct_request AS wq 
WHERE wq.namespace = ct_request.namespace AND wq.resource = ct_request.resource AND wq.state = 'waiting' AND wq.expires_at >= ((julianday('now') - 2440587.5) * 86400.0) ORDER BY wq.queue_key, wq.ticket
 LIMIT ? OFFSET ?) AS head_ticket, (SELECT min(hq.expires_at) AS min_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS hold_exp, (SELECT coalesce(sum(hq.slots), ?) AS coalesce_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS used, (SELECT count(*) AS count_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted' AND hq.mode = ?) AS excl, ct_resource.capacity, ct_resource.rate_count, ct_resource.rate_per 
FROM ct_request JOIN ct_resource ON ct_resource.namespace = ct_request.namespace AND ct_resource.name = ct_request.resource 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.holder = ?;
-- name: head_ticket
SELECT ct_request.ticket 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' AND ct_request.expires_at >= ((julianday('now') - 2440587.5) * 86400.0) ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?;
-- name: delete_expired_request
DELETE FROM ct_request WHERE ct_request.request_key = ? AND ct_request.expires_at < ?;
-- name: delete_requests
DELETE FROM ct_request WHERE ct_request.request_key = ?;
-- name: end_grant
UPDATE ct_grant_history SET ended_at=?, outcome=? WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource = ? AND ct_grant_history.token = ? AND ct_grant_history.outcome = 'held';
-- name: delete_expired_row
DELETE FROM ct_request WHERE ct_request.id = ? AND ct_request.expires_at < ?;
-- name: expired_resources
SELECT DISTINCT ct_request.resource 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.expires_at < ((julianday('now') - 2440587.5) * 86400.0);
-- name: delete_expired_waiters
DELETE FROM ct_request WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.state = 'waiting' AND ct_request.expires_at < ?;

-- ===== set_capacity with a rate limit and aging (rewrites the waiters' queue order) =====
-- name: lock_resource_name
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: create_resource
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at, last_ticket) VALUES (?, ?, ?, ?, ((julianday('now') - 2440587.5) * 86400.0), ?);
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch, ((julianday('now') - 2440587.5) * 86400.0) AS now 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: reorder_queue
UPDATE ct_request SET queue_key=(ct_request.enqueued_at - ct_request.priority * ?) WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting';
-- name: change_resource
UPDATE ct_resource SET capacity=?, rate_count=?, rate_per=?, aging=? WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?) AS anon_1;
-- name: window_count
SELECT count(*) AS count_1 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource = ? AND ct_grant_history.granted_at > ?;

-- ===== rate-limited grants: the window's budget from the grant history; the head times the next opening =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch, ((julianday('now') - 2440587.5) * 86400.0) AS now 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.holder = ?;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?) AS anon_1;
-- name: window_count
SELECT count(*) AS count_1 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource = ? AND ct_grant_history.granted_at > ?;
-- name: grant_waiter
UPDATE ct_request SET state=?, token=?, lease_seconds=?, granted_at=?, expires_at=? WHERE ct_request.id = ? AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);
-- name: write_counters
UPDATE ct_resource SET last_token=?, last_ticket=? WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: delete_request_rows
DELETE FROM ct_request WHERE ct_request.request_key = ? AND ct_request.attempt IS ? RETURNING id, resource, state, token, expires_at;
-- name: end_grant
UPDATE ct_grant_history SET ended_at=?, outcome=? WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource = ? AND ct_grant_history.token = ? AND ct_grant_history.outcome = 'held';
-- name: peek
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key, ((julianday('now') - 2440587.5) * 86400.0) AS now, (SELECT wq.ticket 
FROM ct_request AS wq 
WHERE wq.namespace = ct_request.namespace AND wq.resource = ct_request.resource AND wq.state = 'waiting' AND wq.expires_at >= ((julianday('now') - 2440587.5) * 86400.0) ORDER BY wq.queue_key, wq.ticket
 LIMIT ? OFFSET ?) AS head_ticket, (SELECT min(hq.expires_at) AS min_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS hold_exp, (SELECT coalesce(sum(hq.slots), ?) AS coalesce_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS used, (SELECT count(*) AS count_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted' AND hq.mode = ?) AS excl, ct_resource.capacity, ct_resource.rate_count, ct_resource.rate_per 
FROM ct_request JOIN ct_resource ON ct_resource.namespace = ct_request.namespace AND ct_resource.name = ct_request.resource 
WHERE ct_request.namespace = ? AND ct_request.resource IN (?) AND ct_request.holder = ?;
-- name: head_ticket
SELECT ct_request.ticket 
FROM ct_request 
WHERE ct_request.namespace = ? AND ct_request.resource = ? AND ct_request.state = 'waiting' AND ct_request.expires_at >= ((julianday('now') - 2440587.5) * 86400.0) ORDER BY ct_request.queue_key, ct_request.ticket
 LIMIT ? OFFSET ?;
-- name: refresh_waiter
UPDATE ct_request SET expires_at=?, pickup_seconds=? WHERE ct_request.request_key = ? AND ct_request.state = 'waiting' AND ct_request.expires_at >= ?;
-- name: window_times
SELECT ct_grant_history.granted_at 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource = ? AND ct_grant_history.granted_at > ? ORDER BY ct_grant_history.granted_at;

-- ===== grant history (newest first) =====
-- name: read_now
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS db_now_1;
-- name: records
SELECT ct_grant_history.namespace, ct_grant_history.resource, ct_grant_history.token, ct_grant_history.holder, ct_grant_history.mode, ct_grant_history.slots, ct_grant_history.priority, ct_grant_history.enqueued_at, ct_grant_history.granted_at, ct_grant_history.ended_at, ct_grant_history.outcome 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = ? AND ct_grant_history.granted_at >= ? AND ct_grant_history.resource = ? ORDER BY ct_grant_history.granted_at DESC, ct_grant_history.token DESC
 LIMIT ? OFFSET ?;

-- ===== stats and stats_series from the grant history =====
-- name: read_now
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS db_now_1;
-- name: capacities
SELECT ct_resource.name, ct_resource.capacity 
FROM ct_resource 
WHERE ct_resource.namespace = ? ORDER BY ct_resource.name;
-- name: overlapping
SELECT ct_grant_history.slots, ct_grant_history.enqueued_at, ct_grant_history.granted_at, ct_grant_history.ended_at, ct_grant_history.outcome 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource = ? AND ct_grant_history.granted_at < ? AND (ct_grant_history.ended_at IS NULL OR ct_grant_history.ended_at > ?);
-- name: capacity_of
SELECT ct_resource.capacity 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;

-- ===== prune_history (batches per resource) =====
-- name: resource_names
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = ?;
-- name: rate_period
SELECT ct_resource.rate_per 
FROM ct_resource 
WHERE ct_resource.namespace = ? AND ct_resource.name = ?;
-- name: read_now
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS db_now_1;
-- name: prune_edge
SELECT ct_grant_history.granted_at 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource = ? AND ct_grant_history.granted_at < ? AND ct_grant_history.outcome != 'held' ORDER BY ct_grant_history.granted_at
 LIMIT ? OFFSET ?;
-- name: delete_ended
DELETE FROM ct_grant_history WHERE ct_grant_history.namespace = ? AND ct_grant_history.resource = ? AND ct_grant_history.granted_at < ? AND ct_grant_history.outcome != 'held';

-- ===== events prepare (introspection) =====

-- ===== events prepare: claim columns, claim indexes, statistics (DDL) =====
-- each statement runs in a transaction of its own, after a lock timeout for DDL
-- (Oracle DDL_LOCK_TIMEOUT, PostgreSQL lock_timeout, MySQL lock_wait_timeout, SQL Server LOCK_TIMEOUT);
-- indexes are built online where the server offers it (PostgreSQL CONCURRENTLY, SQL Server and
-- Oracle Enterprise Edition: WITH (ONLINE = ON) / ONLINE appended to CREATE INDEX).
ALTER TABLE events ADD ct_state SMALLINT DEFAULT '0' NOT NULL;
ALTER TABLE events ADD ct_owner VARCHAR(200);
ALTER TABLE events ADD ct_token BIGINT;
ALTER TABLE events ADD ct_expires_at FLOAT;
ALTER TABLE events ADD ct_available_at FLOAT;
ALTER TABLE events ADD ct_attempts INTEGER DEFAULT '0' NOT NULL;
ALTER TABLE events ADD ct_error VARCHAR(2000);
ALTER TABLE events ADD ct_done_at FLOAT;
CREATE INDEX ct_pending_events ON events (event_id) WHERE ct_state = 0;
CREATE INDEX ct_claimed_events ON events (event_id) WHERE ct_state = 1;
ANALYZE events;

-- ===== events claim: one short transaction that skips rows other workers hold =====
-- name: claim_select
-- sqlite: no FOR UPDATE: the transaction's BEGIN IMMEDIATE already made it the only writer
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < ((julianday('now') - 2440587.5) * 86400.0) ORDER BY events.event_id
 LIMIT ? OFFSET ?;
-- name: claim_returning
-- sqlite: no SKIP LOCKED: the transaction's BEGIN IMMEDIATE already made it the only writer
UPDATE events SET ct_state=?, ct_owner=?, ct_token=?, ct_expires_at=(((julianday('now') - 2440587.5) * 86400.0) + ?), ct_attempts=(events.ct_attempts + ?) WHERE events.event_id IN (SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= ((julianday('now') - 2440587.5) * 86400.0)) ORDER BY events.event_id
 LIMIT ? OFFSET ?) RETURNING event_id, payload, ct_state, ct_owner, ct_token, ct_expires_at, ct_available_at, ct_attempts, ct_error, ct_done_at;

-- ===== batch complete (fenced on the batch token) =====
-- name: update_where
UPDATE events SET ct_state=?, ct_expires_at=?, ct_error=?, ct_done_at=((julianday('now') - 2440587.5) * 86400.0) WHERE events.ct_token = ? AND events.ct_state = 1;

-- ===== batch fail (back-off or error state, decided from the stored attempts) =====
-- name: claim_select
-- sqlite: no FOR UPDATE: the transaction's BEGIN IMMEDIATE already made it the only writer
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < ((julianday('now') - 2440587.5) * 86400.0) ORDER BY events.event_id
 LIMIT ? OFFSET ?;
-- name: claim_returning
-- sqlite: no SKIP LOCKED: the transaction's BEGIN IMMEDIATE already made it the only writer
UPDATE events SET ct_state=?, ct_owner=?, ct_token=?, ct_expires_at=(((julianday('now') - 2440587.5) * 86400.0) + ?), ct_attempts=(events.ct_attempts + ?) WHERE events.event_id IN (SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= ((julianday('now') - 2440587.5) * 86400.0)) ORDER BY events.event_id
 LIMIT ? OFFSET ?) RETURNING event_id, payload, ct_state, ct_owner, ct_token, ct_expires_at, ct_available_at, ct_attempts, ct_error, ct_done_at;
-- name: keys_where
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (?, ?, ?, ?, ?, ?, ?, ?) AND events.ct_token = ? AND events.ct_state = 1;
-- name: update_keys
UPDATE events SET ct_state=CASE WHEN (events.ct_attempts >= ?) THEN ? ELSE ? END, ct_owner=?, ct_token=?, ct_expires_at=?, ct_available_at=CASE WHEN (events.ct_attempts >= ?) THEN NULL WHEN (events.ct_attempts <= ?) THEN ((julianday('now') - 2440587.5) * 86400.0) + ? WHEN (events.ct_attempts <= ?) THEN ((julianday('now') - 2440587.5) * 86400.0) + ? WHEN (events.ct_attempts <= ?) THEN ((julianday('now') - 2440587.5) * 86400.0) + ? WHEN (events.ct_attempts <= ?) THEN ((julianday('now') - 2440587.5) * 86400.0) + ? ELSE ((julianday('now') - 2440587.5) * 86400.0) + ? END, ct_error=? WHERE events.event_id IN (?, ?, ?, ?, ?, ?, ?, ?) AND events.ct_token = ? AND events.ct_state = 1;

-- ===== batch renew and release =====
-- name: claim_select
-- sqlite: no FOR UPDATE: the transaction's BEGIN IMMEDIATE already made it the only writer
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < ((julianday('now') - 2440587.5) * 86400.0) ORDER BY events.event_id
 LIMIT ? OFFSET ?;
-- name: claim_returning
-- sqlite: no SKIP LOCKED: the transaction's BEGIN IMMEDIATE already made it the only writer
UPDATE events SET ct_state=?, ct_owner=?, ct_token=?, ct_expires_at=(((julianday('now') - 2440587.5) * 86400.0) + ?), ct_attempts=(events.ct_attempts + ?) WHERE events.event_id IN (SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= ((julianday('now') - 2440587.5) * 86400.0)) ORDER BY events.event_id
 LIMIT ? OFFSET ?) RETURNING event_id, payload, ct_state, ct_owner, ct_token, ct_expires_at, ct_available_at, ct_attempts, ct_error, ct_done_at;
-- name: read_now
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS db_now_1;
-- name: keys_where
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (?, ?) AND events.ct_token = ? AND events.ct_state = 1 AND events.ct_expires_at >= ?;
-- name: update_keys
UPDATE events SET ct_expires_at=? WHERE events.event_id IN (?, ?) AND events.ct_token = ? AND events.ct_state = 1;
-- name: keys_where
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (?, ?) AND events.ct_token = ? AND events.ct_state = 1;
-- name: update_keys
UPDATE events SET ct_state=?, ct_owner=?, ct_token=?, ct_expires_at=?, ct_attempts=CASE WHEN (events.ct_attempts > ?) THEN events.ct_attempts - ? ELSE ? END WHERE events.event_id IN (?, ?) AND events.ct_token = ? AND events.ct_state = 1;

-- ===== events stats =====
-- name: read_now
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS db_now_1;
-- name: counts_by_state
SELECT coalesce(events.ct_state, 0) AS coalesce_1, count(*) AS count_1 
FROM events GROUP BY coalesce(events.ct_state, 0);
-- name: count_expired
SELECT count(*) AS count_1 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < ?;
-- name: oldest_pending
SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 ORDER BY events.event_id
 LIMIT ? OFFSET ?;

-- ===== events error rows (the status page) =====
-- name: error_rows
SELECT events.event_id, events.ct_attempts, events.ct_error 
FROM events 
WHERE events.ct_state = 3 ORDER BY events.event_id
 LIMIT ? OFFSET ?;

-- ===== events retry_errors =====
-- name: update_where
UPDATE events SET ct_state=?, ct_available_at=?, ct_attempts=?, ct_error=? WHERE events.ct_state = 3;

-- ===== worklist populate =====
-- name: lock_list
-- sqlite: no FOR UPDATE: the transaction's BEGIN IMMEDIATE already holds the database's write lock
SELECT ct_worklist.last_token, 1 AS epoch 
FROM ct_worklist 
WHERE ct_worklist.namespace = ? AND ct_worklist.name = ?;
-- name: create_list
INSERT INTO ct_worklist (namespace, name, last_token, created_at) VALUES (?, ?, ?, ((julianday('now') - 2440587.5) * 86400.0));
-- name: read_now
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS db_now_1;
-- name: insert_items
INSERT INTO ct_work_item (namespace, worklist, exec_order, priority, payload, state, attempts, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?);

-- ===== worklist allocate: lock the work list row, lowest unfinished order only =====
-- name: lock_list
-- sqlite: no FOR UPDATE: the transaction's BEGIN IMMEDIATE already holds the database's write lock
SELECT ct_worklist.last_token, 1 AS epoch 
FROM ct_worklist 
WHERE ct_worklist.namespace = ? AND ct_worklist.name = ?;
-- name: current_order
SELECT min(ct_work_item.exec_order) AS current, ((julianday('now') - 2440587.5) * 86400.0) AS now 
FROM ct_work_item 
WHERE ct_work_item.namespace = ? AND ct_work_item.worklist = ? AND ct_work_item.state IN ('new', 'active', 'error');
-- name: next_item
SELECT anon_1.id, anon_1.payload, anon_1.exec_order, anon_1.priority, anon_1.attempts, anon_1.state, anon_1.token 
FROM (SELECT ct_work_item.id AS id, ct_work_item.payload AS payload, ct_work_item.exec_order AS exec_order, ct_work_item.priority AS priority, ct_work_item.attempts AS attempts, ct_work_item.state AS state, ct_work_item.token AS token 
FROM ct_work_item 
WHERE ct_work_item.namespace = ? AND ct_work_item.worklist = ? AND ct_work_item.state = 'new' AND ct_work_item.exec_order = ? ORDER BY ct_work_item.priority DESC, ct_work_item.id
 LIMIT ? OFFSET ?) AS anon_1 UNION ALL SELECT anon_2.id, anon_2.payload, anon_2.exec_order, anon_2.priority, anon_2.attempts, anon_2.state, anon_2.token 
FROM (SELECT ct_work_item.id AS id, ct_work_item.payload AS payload, ct_work_item.exec_order AS exec_order, ct_work_item.priority AS priority, ct_work_item.attempts AS attempts, ct_work_item.state AS state, ct_work_item.token AS token 
FROM ct_work_item 
WHERE ct_work_item.namespace = ? AND ct_work_item.worklist = ? AND ct_work_item.state = 'active' AND ct_work_item.exec_order = ? AND ct_work_item.expires_at < ? ORDER BY ct_work_item.priority DESC, ct_work_item.id
 LIMIT ? OFFSET ?) AS anon_2;
-- name: allocate_item
UPDATE ct_work_item SET state=?, owner=?, token=?, attempts=(ct_work_item.attempts + ?), started_at=?, finished_at=?, expires_at=? WHERE ct_work_item.id = ? AND ct_work_item.state = 'new';
-- name: set_last_token
UPDATE ct_worklist SET last_token=? WHERE ct_worklist.namespace = ? AND ct_worklist.name = ?;

-- ===== work item complete (fenced on the item token) =====
-- name: finish
UPDATE ct_work_item SET state=?, last_error=?, finished_at=((julianday('now') - 2440587.5) * 86400.0), expires_at=? WHERE ct_work_item.id = ? AND ct_work_item.token = ? AND ct_work_item.state = 'active';

-- ===== worklist status =====
-- name: read_now
SELECT ((julianday('now') - 2440587.5) * 86400.0) AS db_now_1;
-- name: counts
SELECT ct_work_item.exec_order, ct_work_item.state, count(*) AS count_1, sum(CASE WHEN (ct_work_item.state = 'active' AND ct_work_item.expires_at < ?) THEN ? ELSE ? END) AS sum_1 
FROM ct_work_item 
WHERE ct_work_item.namespace = ? AND ct_work_item.worklist = ? GROUP BY ct_work_item.exec_order, ct_work_item.state ORDER BY ct_work_item.exec_order;
