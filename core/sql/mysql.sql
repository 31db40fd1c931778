-- controltable: DDL and statements for mysql (server version 8.0)
-- Run the DDL once with DDL rights (or `controltable init`); afterwards the engine needs DML only
-- (SELECT, INSERT, UPDATE, DELETE on the tables below and on your event tables).
-- Each statement the engine sends is printed under the name of its builder (`-- name: claim_select`:
-- the function or method of controltable's statements modules, or the function that sent it), with
-- a `-- mysql: ...` line where it is shaped differently on mysql for a reason.

-- ===== control tables =====
CREATE TABLE ct_grant_history (
	namespace VARCHAR(100) NOT NULL, 
	resource VARCHAR(200) NOT NULL, 
	token BIGINT NOT NULL, 
	holder VARCHAR(200) NOT NULL, 
	mode VARCHAR(10) NOT NULL, 
	slots INTEGER NOT NULL, 
	priority INTEGER NOT NULL, 
	enqueued_at FLOAT(53) NOT NULL, 
	granted_at FLOAT(53) NOT NULL, 
	ended_at FLOAT(53), 
	outcome VARCHAR(10) NOT NULL, 
	CONSTRAINT ct_grant_history_pk PRIMARY KEY (namespace, resource, token)
)CHARSET=utf8mb4 COLLATE utf8mb4_bin;
CREATE INDEX ct_grant_history_time_ix ON ct_grant_history (namespace, resource, granted_at);
CREATE TABLE ct_meta (
	`key` VARCHAR(64) NOT NULL, 
	value VARCHAR(255) NOT NULL, 
	PRIMARY KEY (`key`)
)CHARSET=utf8mb4 COLLATE utf8mb4_bin;
CREATE TABLE ct_request (
	id BIGINT NOT NULL AUTO_INCREMENT, 
	namespace VARCHAR(100) NOT NULL, 
	resource VARCHAR(200) NOT NULL, 
	holder VARCHAR(200) NOT NULL, 
	request_key VARCHAR(64) NOT NULL, 
	slots INTEGER NOT NULL, 
	mode VARCHAR(10) NOT NULL, 
	state VARCHAR(10) NOT NULL, 
	token BIGINT, 
	lease_seconds FLOAT(53) NOT NULL, 
	enqueued_at FLOAT(53) NOT NULL, 
	granted_at FLOAT(53), 
	expires_at FLOAT(53) NOT NULL, 
	ticket BIGINT NOT NULL DEFAULT 0, 
	attempt INTEGER, 
	pickup_seconds FLOAT(53), 
	priority INTEGER NOT NULL DEFAULT 0, 
	queue_key FLOAT(53) NOT NULL DEFAULT 0, 
	PRIMARY KEY (id), 
	CONSTRAINT ct_request_holder_uq UNIQUE (namespace, resource, holder)
)CHARSET=utf8mb4 COLLATE utf8mb4_bin;
CREATE INDEX ct_request_key_ix ON ct_request (request_key);
CREATE INDEX ct_request_order_ix ON ct_request (namespace, resource, state, queue_key, ticket);
CREATE TABLE ct_resource (
	namespace VARCHAR(100) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	capacity INTEGER NOT NULL, 
	last_token BIGINT NOT NULL, 
	created_at FLOAT(53) NOT NULL, 
	last_ticket BIGINT NOT NULL DEFAULT 0, 
	rate_count INTEGER, 
	rate_per FLOAT(53), 
	aging FLOAT(53), 
	CONSTRAINT ct_resource_pk PRIMARY KEY (namespace, name)
)CHARSET=utf8mb4 COLLATE utf8mb4_bin;
CREATE TABLE ct_work_item (
	id BIGINT NOT NULL AUTO_INCREMENT, 
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
	created_at FLOAT(53) NOT NULL, 
	started_at FLOAT(53), 
	finished_at FLOAT(53), 
	expires_at FLOAT(53), 
	PRIMARY KEY (id)
)CHARSET=utf8mb4 COLLATE utf8mb4_bin;
CREATE INDEX ct_work_item_next_ix ON ct_work_item (namespace, worklist, state, exec_order, priority DESC, id);
CREATE TABLE ct_worklist (
	namespace VARCHAR(100) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	last_token BIGINT NOT NULL, 
	created_at FLOAT(53) NOT NULL, 
	CONSTRAINT ct_worklist_pk PRIMARY KEY (namespace, name)
)CHARSET=utf8mb4 COLLATE utf8mb4_bin;

-- ===== set_capacity: lock or create the resource row, then a grant pass (more capacity may admit waiters) =====
-- name: lock_resource_name
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: create_resource
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at, last_ticket) VALUES (%s, %s, %s, %s, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0), %s);
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: change_resource
UPDATE ct_resource SET capacity=%s WHERE ct_resource.namespace = %s AND ct_resource.name = %s;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s) AS anon_1;

-- ===== acquire: lock the resource rows, enqueue under the next ticket, grant pass over holders and head =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.holder = %s;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s) AS anon_1;
-- name: grant_waiter
UPDATE ct_request SET state=%s, token=%s, lease_seconds=%s, granted_at=%s, expires_at=%s WHERE ct_request.id = %s AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);
-- name: write_counters
UPDATE ct_resource SET last_token=%s, last_ticket=%s WHERE ct_resource.namespace = %s AND ct_resource.name = %s;

-- ===== try_acquire while held: read its own entry without locks, then enqueue as a waiter (ticketed FIFO) =====
-- name: peek
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS now, (SELECT wq.ticket 
FROM ct_request AS wq 
WHERE wq.namespace = ct_request.namespace AND wq.resource = ct_request.resource AND wq.state = 'waiting' AND wq.expires_at >= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) ORDER BY wq.queue_key, wq.ticket 
 LIMIT %s) AS head_ticket, (SELECT min(hq.expires_at) AS min_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS hold_exp, (SELECT coalesce(sum(hq.slots), %s) AS coalesce_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS used, (SELECT count(*) AS count_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted' AND hq.mode = %s) AS excl, ct_resource.capacity, ct_resource.rate_count, ct_resource.rate_per 
FROM ct_request INNER JOIN ct_resource ON ct_resource.namespace = ct_request.namespace AND ct_resource.name = ct_request.resource 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.holder = %s;
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.holder = %s;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s) AS anon_1;
-- name: write_counters
UPDATE ct_resource SET last_token=%s, last_ticket=%s WHERE ct_resource.namespace = %s AND ct_resource.name = %s;
-- name: head_ticket
SELECT ct_request.ticket 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' AND ct_request.expires_at >= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s;

-- ===== renew a lease: extend on the database clock while granted and unexpired (fenced by key and attempt) =====
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: extend_lease
UPDATE ct_request SET lease_seconds=%s, expires_at=%s WHERE ct_request.request_key = %s AND ct_request.attempt <=> %s AND ct_request.state = 'granted' AND ct_request.expires_at >= %s;

-- ===== release a lease: lock the resource row, delete the entry, grant pass for the next in line =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: release_rows
SELECT ct_request.id, ct_request.resource, ct_request.state, ct_request.token, ct_request.expires_at 
FROM ct_request 
WHERE ct_request.request_key = %s AND ct_request.attempt <=> %s;
-- name: delete_release_rows
DELETE FROM ct_request WHERE ct_request.request_key = %s AND ct_request.attempt <=> %s;
-- name: end_grant
UPDATE ct_grant_history SET ended_at=%s, outcome=%s WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource = %s AND ct_grant_history.token = %s AND ct_grant_history.outcome = 'held';
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s) AS anon_1;
-- name: grant_waiter
UPDATE ct_request SET state=%s, token=%s, granted_at=%s, expires_at=%s WHERE ct_request.id = %s AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);
-- name: write_counters
UPDATE ct_resource SET last_token=%s, last_ticket=%s WHERE ct_resource.namespace = %s AND ct_resource.name = %s;

-- ===== release a grant released already (another lease of it): the grant history says how it ended =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: release_rows
SELECT ct_request.id, ct_request.resource, ct_request.state, ct_request.token, ct_request.expires_at 
FROM ct_request 
WHERE ct_request.request_key = %s AND ct_request.attempt <=> %s;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s) AS anon_1;
-- name: grant_outcomes
SELECT ct_grant_history.resource, ct_grant_history.token, ct_grant_history.outcome 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource IN (%s) AND ct_grant_history.token IN (%s);

-- ===== status: resources, holders and waiters (no locks) =====
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: resources
SELECT ct_resource.namespace, ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.created_at, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging 
FROM ct_resource 
WHERE ct_resource.namespace = %s ORDER BY ct_resource.name;
-- name: requests
SELECT ct_request.id, ct_request.namespace, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.lease_seconds, ct_request.enqueued_at, ct_request.granted_at, ct_request.expires_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.priority, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s ORDER BY ct_request.resource, ct_request.ticket;

-- ===== reap: resources with entries expired on the database clock (each then reaped under its lock) =====
-- name: expired_resources
SELECT DISTINCT ct_request.resource 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.expires_at < (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0);

-- ===== expiry: an expired holder or waiter is deleted with its expiry re-checked (on SQL Server the DELETE returns the ids it removed: the row count is never trusted) =====
-- name: lock_resource_name
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: create_resource
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at, last_ticket) VALUES (%s, %s, %s, %s, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0), %s);
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: change_resource
UPDATE ct_resource SET capacity=%s WHERE ct_resource.namespace = %s AND ct_resource.name = %s;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s) AS anon_1;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.holder = %s;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);
-- name: grant_waiter
UPDATE ct_request SET state=%s, token=%s, lease_seconds=%s, granted_at=%s, expires_at=%s WHERE ct_request.id = %s AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);
-- name: write_counters
UPDATE ct_resource SET last_token=%s, last_ticket=%s WHERE ct_resource.namespace = %s AND ct_resource.name = %s;
-- name: peek
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS now, (SELECT wq.ticket 
FROM ct_request AS wq 
WHERE wq.namespace = ct_request.namespace AND wq.resource = ct_request.resource AND wq.state = 'waiting' AND wq.expires_at >= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) ORDER BY wq.queue_key, wq.ticket 
 LIMIT %s) AS head_ticket, (SELECT min(hq.expires_at) AS min_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS hold_exp, (SELECT coalesce(sum(hq.slots), %s) AS coalesce_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS used, (SELECT count(*) AS count_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted' AND hq.mode = %s) AS excl, ct_resource.capacity, ct_resource.rate_count, ct_resource.rate_per 
FROM ct_request INNER JOIN ct_resource ON ct_resource.namespace = ct_request.namespace AND ct_resource.name = ct_request.resource 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.holder = %s;
-- name: head_ticket
SELECT ct_request.ticket 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' AND ct_request.expires_at >= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s;
-- name: delete_expired_request
DELETE FROM ct_request WHERE ct_request.request_key = %s AND ct_request.expires_at < %s;
-- name: delete_requests
DELETE FROM ct_request WHERE ct_request.request_key = %s;
-- name: end_grant
UPDATE ct_grant_history SET ended_at=%s, outcome=%s WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource = %s AND ct_grant_history.token = %s AND ct_grant_history.outcome = 'held';
-- name: delete_expired_row
DELETE FROM ct_request WHERE ct_request.id = %s AND ct_request.expires_at < %s;
-- name: expired_resources
SELECT DISTINCT ct_request.resource 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.expires_at < (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0);
-- name: delete_expired_waiters
DELETE FROM ct_request WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.state = 'waiting' AND ct_request.expires_at < %s;

-- ===== set_capacity with a rate limit and aging (rewrites the waiters' queue order) =====
-- name: lock_resource_name
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: create_resource
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at, last_ticket) VALUES (%s, %s, %s, %s, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0), %s);
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: reorder_queue
UPDATE ct_request SET queue_key=(ct_request.enqueued_at - ct_request.priority * %s) WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting';
-- name: change_resource
UPDATE ct_resource SET capacity=%s, rate_count=%s, rate_per=%s, aging=%s WHERE ct_resource.namespace = %s AND ct_resource.name = %s;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s) AS anon_1;
-- name: window_count
SELECT count(*) AS count_1 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource = %s AND ct_grant_history.granted_at > %s;

-- ===== rate-limited grants: the window's budget from the grant history; the head times the next opening =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s FOR UPDATE;
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.holder = %s;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s) AS anon_1;
-- name: window_count
SELECT count(*) AS count_1 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource = %s AND ct_grant_history.granted_at > %s;
-- name: grant_waiter
UPDATE ct_request SET state=%s, token=%s, lease_seconds=%s, granted_at=%s, expires_at=%s WHERE ct_request.id = %s AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);
-- name: write_counters
UPDATE ct_resource SET last_token=%s, last_ticket=%s WHERE ct_resource.namespace = %s AND ct_resource.name = %s;
-- name: release_rows
SELECT ct_request.id, ct_request.resource, ct_request.state, ct_request.token, ct_request.expires_at 
FROM ct_request 
WHERE ct_request.request_key = %s AND ct_request.attempt <=> %s;
-- name: delete_release_rows
DELETE FROM ct_request WHERE ct_request.request_key = %s AND ct_request.attempt <=> %s;
-- name: end_grant
UPDATE ct_grant_history SET ended_at=%s, outcome=%s WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource = %s AND ct_grant_history.token = %s AND ct_grant_history.outcome = 'held';
-- name: peek
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS now, (SELECT wq.ticket 
FROM ct_request AS wq 
WHERE wq.namespace = ct_request.namespace AND wq.resource = ct_request.resource AND wq.state = 'waiting' AND wq.expires_at >= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) ORDER BY wq.queue_key, wq.ticket 
 LIMIT %s) AS head_ticket, (SELECT min(hq.expires_at) AS min_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS hold_exp, (SELECT coalesce(sum(hq.slots), %s) AS coalesce_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS used, (SELECT count(*) AS count_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted' AND hq.mode = %s) AS excl, ct_resource.capacity, ct_resource.rate_count, ct_resource.rate_per 
FROM ct_request INNER JOIN ct_resource ON ct_resource.namespace = ct_request.namespace AND ct_resource.name = ct_request.resource 
WHERE ct_request.namespace = %s AND ct_request.resource IN (%s) AND ct_request.holder = %s;
-- name: head_ticket
SELECT ct_request.ticket 
FROM ct_request 
WHERE ct_request.namespace = %s AND ct_request.resource = %s AND ct_request.state = 'waiting' AND ct_request.expires_at >= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) ORDER BY ct_request.queue_key, ct_request.ticket 
 LIMIT %s;
-- name: refresh_waiter
UPDATE ct_request SET expires_at=%s, pickup_seconds=%s WHERE ct_request.request_key = %s AND ct_request.state = 'waiting' AND ct_request.expires_at >= %s;
-- name: window_times
SELECT ct_grant_history.granted_at 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource = %s AND ct_grant_history.granted_at > %s ORDER BY ct_grant_history.granted_at;

-- ===== grant history (newest first) =====
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: records
SELECT ct_grant_history.namespace, ct_grant_history.resource, ct_grant_history.token, ct_grant_history.holder, ct_grant_history.mode, ct_grant_history.slots, ct_grant_history.priority, ct_grant_history.enqueued_at, ct_grant_history.granted_at, ct_grant_history.ended_at, ct_grant_history.outcome 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = %s AND ct_grant_history.granted_at >= %s AND ct_grant_history.resource = %s ORDER BY ct_grant_history.granted_at DESC, ct_grant_history.token DESC 
 LIMIT %s;

-- ===== stats and stats_series from the grant history =====
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: capacities
SELECT ct_resource.name, ct_resource.capacity 
FROM ct_resource 
WHERE ct_resource.namespace = %s ORDER BY ct_resource.name;
-- name: overlapping
SELECT ct_grant_history.slots, ct_grant_history.enqueued_at, ct_grant_history.granted_at, ct_grant_history.ended_at, ct_grant_history.outcome 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource = %s AND ct_grant_history.granted_at < %s AND (ct_grant_history.ended_at IS NULL OR ct_grant_history.ended_at > %s);
-- name: capacity_of
SELECT ct_resource.capacity 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s;

-- ===== prune_history (batches per resource) =====
-- name: resource_names
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = %s;
-- name: rate_period
SELECT ct_resource.rate_per 
FROM ct_resource 
WHERE ct_resource.namespace = %s AND ct_resource.name = %s;
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: prune_edge
SELECT ct_grant_history.granted_at 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource = %s AND ct_grant_history.granted_at < %s AND ct_grant_history.outcome != 'held' ORDER BY ct_grant_history.granted_at 
 LIMIT %s, %s;
-- name: delete_ended
DELETE FROM ct_grant_history WHERE ct_grant_history.namespace = %s AND ct_grant_history.resource = %s AND ct_grant_history.granted_at < %s AND ct_grant_history.outcome != 'held';

-- ===== events prepare (introspection) =====

-- ===== events prepare: claim columns, claim indexes, statistics (DDL) =====
-- each statement runs in a transaction of its own, after a lock timeout for DDL
-- (Oracle DDL_LOCK_TIMEOUT, PostgreSQL lock_timeout, MySQL lock_wait_timeout, SQL Server LOCK_TIMEOUT);
-- indexes are built online where the server offers it (PostgreSQL CONCURRENTLY, SQL Server and
-- Oracle Enterprise Edition: WITH (ONLINE = ON) / ONLINE appended to CREATE INDEX).
ALTER TABLE events ADD ct_state SMALLINT NOT NULL DEFAULT '0';
ALTER TABLE events ADD ct_owner VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE events ADD ct_token BIGINT;
ALTER TABLE events ADD ct_expires_at FLOAT(53);
ALTER TABLE events ADD ct_available_at FLOAT(53);
ALTER TABLE events ADD ct_attempts INTEGER NOT NULL DEFAULT '0';
ALTER TABLE events ADD ct_error VARCHAR(2000) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE events ADD ct_done_at FLOAT(53);
CREATE INDEX ct_claim_events ON events (ct_state, event_id);
ANALYZE TABLE events;

-- ===== events claim: one short transaction that skips rows other workers hold =====
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: claim_select
-- mysql: no UPDATE ... RETURNING: this select locks the rows, an UPDATE by key marks them; one state per select, or MariaDB sorts and locks every candidate
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < %s ORDER BY events.event_id 
 LIMIT %s FOR UPDATE SKIP LOCKED;
-- name: claim_select
-- mysql: no UPDATE ... RETURNING: this select locks the rows, an UPDATE by key marks them; one state per select, or MariaDB sorts and locks every candidate
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= %s) ORDER BY events.event_id 
 LIMIT %s FOR UPDATE SKIP LOCKED;
-- name: update_keys
UPDATE events SET ct_state=%s, ct_owner=%s, ct_token=%s, ct_expires_at=%s, ct_attempts=(events.ct_attempts + %s) WHERE events.event_id IN (%s, %s, %s, %s, %s, %s, %s, %s) AND events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= %s);

-- ===== batch complete (fenced on the batch token) =====
-- name: update_where
UPDATE events SET ct_state=%s, ct_expires_at=%s, ct_error=%s, ct_done_at=(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) WHERE events.ct_token = %s AND events.ct_state = 1;

-- ===== batch fail (back-off or error state, decided from the stored attempts) =====
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: claim_select
-- mysql: no UPDATE ... RETURNING: this select locks the rows, an UPDATE by key marks them; one state per select, or MariaDB sorts and locks every candidate
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < %s ORDER BY events.event_id 
 LIMIT %s FOR UPDATE SKIP LOCKED;
-- name: claim_select
-- mysql: no UPDATE ... RETURNING: this select locks the rows, an UPDATE by key marks them; one state per select, or MariaDB sorts and locks every candidate
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= %s) ORDER BY events.event_id 
 LIMIT %s FOR UPDATE SKIP LOCKED;
-- name: update_keys
UPDATE events SET ct_state=%s, ct_owner=%s, ct_token=%s, ct_expires_at=%s, ct_attempts=(events.ct_attempts + %s) WHERE events.event_id IN (%s, %s, %s, %s, %s, %s, %s, %s) AND events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= %s);
-- name: keys_where
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (%s, %s, %s, %s, %s, %s, %s, %s) AND events.ct_token = %s AND events.ct_state = 1 FOR UPDATE;
-- name: update_keys
UPDATE events SET ct_state=CASE WHEN (events.ct_attempts >= %s) THEN %s ELSE %s END, ct_owner=%s, ct_token=%s, ct_expires_at=%s, ct_available_at=CASE WHEN (events.ct_attempts >= %s) THEN NULL WHEN (events.ct_attempts <= %s) THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) + %s WHEN (events.ct_attempts <= %s) THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) + %s WHEN (events.ct_attempts <= %s) THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) + %s WHEN (events.ct_attempts <= %s) THEN (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) + %s ELSE (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) + %s END, ct_error=%s WHERE events.event_id IN (%s, %s, %s, %s, %s, %s, %s, %s) AND events.ct_token = %s AND events.ct_state = 1;

-- ===== batch renew and release =====
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: claim_select
-- mysql: no UPDATE ... RETURNING: this select locks the rows, an UPDATE by key marks them; one state per select, or MariaDB sorts and locks every candidate
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < %s ORDER BY events.event_id 
 LIMIT %s FOR UPDATE SKIP LOCKED;
-- name: claim_select
-- mysql: no UPDATE ... RETURNING: this select locks the rows, an UPDATE by key marks them; one state per select, or MariaDB sorts and locks every candidate
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= %s) ORDER BY events.event_id 
 LIMIT %s FOR UPDATE SKIP LOCKED;
-- name: update_keys
UPDATE events SET ct_state=%s, ct_owner=%s, ct_token=%s, ct_expires_at=%s, ct_attempts=(events.ct_attempts + %s) WHERE events.event_id IN (%s, %s) AND events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= %s);
-- name: keys_where
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (%s, %s) AND events.ct_token = %s AND events.ct_state = 1 AND events.ct_expires_at >= %s FOR UPDATE;
-- name: update_keys
UPDATE events SET ct_expires_at=%s WHERE events.event_id IN (%s, %s) AND events.ct_token = %s AND events.ct_state = 1;
-- name: keys_where
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (%s, %s) AND events.ct_token = %s AND events.ct_state = 1 FOR UPDATE;
-- name: update_keys
UPDATE events SET ct_state=%s, ct_owner=%s, ct_token=%s, ct_expires_at=%s, ct_attempts=CASE WHEN (events.ct_attempts > %s) THEN events.ct_attempts - %s ELSE %s END WHERE events.event_id IN (%s, %s) AND events.ct_token = %s AND events.ct_state = 1;

-- ===== events stats =====
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: counts_by_state
SELECT coalesce(events.ct_state, 0) AS coalesce_1, count(*) AS count_1 
FROM events GROUP BY coalesce(events.ct_state, 0);
-- name: count_expired
SELECT count(*) AS count_1 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < %s;
-- name: oldest_pending
SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 ORDER BY events.event_id 
 LIMIT %s;

-- ===== events error rows (the status page) =====
-- name: error_rows
SELECT events.event_id, events.ct_attempts, events.ct_error 
FROM events 
WHERE events.ct_state = 3 ORDER BY events.event_id 
 LIMIT %s;

-- ===== events retry_errors =====
-- name: update_where
UPDATE events SET ct_state=%s, ct_available_at=%s, ct_attempts=%s, ct_error=%s WHERE events.ct_state = 3;

-- ===== worklist populate =====
-- name: lock_list
SELECT ct_worklist.last_token, 1 AS epoch 
FROM ct_worklist 
WHERE ct_worklist.namespace = %s AND ct_worklist.name = %s FOR UPDATE;
-- name: create_list
INSERT INTO ct_worklist (namespace, name, last_token, created_at) VALUES (%s, %s, %s, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0));
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: insert_items
INSERT INTO ct_work_item (namespace, worklist, exec_order, priority, payload, state, attempts, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s);

-- ===== worklist allocate: lock the work list row, lowest unfinished order only =====
-- name: lock_list
SELECT ct_worklist.last_token, 1 AS epoch 
FROM ct_worklist 
WHERE ct_worklist.namespace = %s AND ct_worklist.name = %s FOR UPDATE;
-- name: current_order
SELECT min(ct_work_item.exec_order) AS current, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS now 
FROM ct_work_item 
WHERE ct_work_item.namespace = %s AND ct_work_item.worklist = %s AND ct_work_item.state IN ('new', 'active', 'error');
-- name: next_item
SELECT anon_1.id, anon_1.payload, anon_1.exec_order, anon_1.priority, anon_1.attempts, anon_1.state, anon_1.token 
FROM (SELECT ct_work_item.id AS id, ct_work_item.payload AS payload, ct_work_item.exec_order AS exec_order, ct_work_item.priority AS priority, ct_work_item.attempts AS attempts, ct_work_item.state AS state, ct_work_item.token AS token 
FROM ct_work_item 
WHERE ct_work_item.namespace = %s AND ct_work_item.worklist = %s AND ct_work_item.state = 'new' AND ct_work_item.exec_order = %s ORDER BY ct_work_item.priority DESC, ct_work_item.id 
 LIMIT %s) AS anon_1 UNION ALL SELECT anon_2.id, anon_2.payload, anon_2.exec_order, anon_2.priority, anon_2.attempts, anon_2.state, anon_2.token 
FROM (SELECT ct_work_item.id AS id, ct_work_item.payload AS payload, ct_work_item.exec_order AS exec_order, ct_work_item.priority AS priority, ct_work_item.attempts AS attempts, ct_work_item.state AS state, ct_work_item.token AS token 
FROM ct_work_item 
WHERE ct_work_item.namespace = %s AND ct_work_item.worklist = %s AND ct_work_item.state = 'active' AND ct_work_item.exec_order = %s AND ct_work_item.expires_at < %s ORDER BY ct_work_item.priority DESC, ct_work_item.id 
 LIMIT %s) AS anon_2;
-- name: allocate_item
UPDATE ct_work_item SET state=%s, owner=%s, token=%s, attempts=(ct_work_item.attempts + %s), started_at=%s, finished_at=%s, expires_at=%s WHERE ct_work_item.id = %s AND ct_work_item.state = 'new';
-- name: set_last_token
UPDATE ct_worklist SET last_token=%s WHERE ct_worklist.namespace = %s AND ct_worklist.name = %s;

-- ===== work item complete (fenced on the item token) =====
-- name: finish
UPDATE ct_work_item SET state=%s, last_error=%s, finished_at=(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0), expires_at=%s WHERE ct_work_item.id = %s AND ct_work_item.token = %s AND ct_work_item.state = 'active';

-- ===== worklist status =====
-- name: read_now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000.0) AS db_now_1;
-- name: counts
SELECT ct_work_item.exec_order, ct_work_item.state, count(*) AS count_1, sum(CASE WHEN (ct_work_item.state = 'active' AND ct_work_item.expires_at < %s) THEN %s ELSE %s END) AS sum_1 
FROM ct_work_item 
WHERE ct_work_item.namespace = %s AND ct_work_item.worklist = %s GROUP BY ct_work_item.exec_order, ct_work_item.state ORDER BY ct_work_item.exec_order;
