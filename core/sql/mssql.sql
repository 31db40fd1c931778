-- controltable: DDL and statements for mssql (server version 15.0)
-- Run the DDL once with DDL rights (or `controltable init`); afterwards the engine needs DML only
-- (SELECT, INSERT, UPDATE, DELETE on the tables below and on your event tables).
-- Each statement the engine sends is printed under the name of its builder (`-- name: claim_select`:
-- the function or method of controltable's statements modules, or the function that sent it), with
-- a `-- mssql: ...` line where it is shaped differently on mssql for a reason.

-- ===== control tables =====
CREATE TABLE ct_grant_history (
	namespace NVARCHAR(100) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	resource NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	token BIGINT NOT NULL, 
	holder NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	mode VARCHAR(10) NOT NULL, 
	slots INTEGER NOT NULL, 
	priority INTEGER NOT NULL, 
	enqueued_at FLOAT(53) NOT NULL, 
	granted_at FLOAT(53) NOT NULL, 
	ended_at FLOAT(53) NULL, 
	outcome VARCHAR(10) NOT NULL, 
	CONSTRAINT ct_grant_history_pk PRIMARY KEY (namespace, resource, token)
);
CREATE INDEX ct_grant_history_time_ix ON ct_grant_history (namespace, resource, granted_at);
CREATE TABLE ct_meta (
	[key] NVARCHAR(64) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	value VARCHAR(255) NOT NULL, 
	PRIMARY KEY ([key])
);
CREATE TABLE ct_request (
	id BIGINT NOT NULL IDENTITY, 
	namespace NVARCHAR(100) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	resource NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	holder NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	request_key NVARCHAR(64) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	slots INTEGER NOT NULL, 
	mode VARCHAR(10) NOT NULL, 
	state VARCHAR(10) NOT NULL, 
	token BIGINT NULL, 
	lease_seconds FLOAT(53) NOT NULL, 
	enqueued_at FLOAT(53) NOT NULL, 
	granted_at FLOAT(53) NULL, 
	expires_at FLOAT(53) NOT NULL, 
	ticket BIGINT NOT NULL DEFAULT 0, 
	attempt INTEGER NULL, 
	pickup_seconds FLOAT(53) NULL, 
	priority INTEGER NOT NULL DEFAULT 0, 
	queue_key FLOAT(53) NOT NULL DEFAULT 0, 
	PRIMARY KEY (id), 
	CONSTRAINT ct_request_holder_uq UNIQUE (namespace, resource, holder)
);
CREATE INDEX ct_request_key_ix ON ct_request (request_key);
CREATE INDEX ct_request_order_ix ON ct_request (namespace, resource, state, queue_key, ticket);
CREATE TABLE ct_resource (
	namespace NVARCHAR(100) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	name NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	capacity INTEGER NOT NULL, 
	last_token BIGINT NOT NULL, 
	created_at FLOAT(53) NOT NULL, 
	last_ticket BIGINT NOT NULL DEFAULT 0, 
	rate_count INTEGER NULL, 
	rate_per FLOAT(53) NULL, 
	aging FLOAT(53) NULL, 
	CONSTRAINT ct_resource_pk PRIMARY KEY (namespace, name)
);
CREATE TABLE ct_work_item (
	id BIGINT NOT NULL IDENTITY, 
	namespace NVARCHAR(100) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	worklist NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	exec_order INTEGER NOT NULL, 
	priority INTEGER NOT NULL, 
	payload NVARCHAR(max) NOT NULL, 
	state VARCHAR(10) NOT NULL, 
	owner NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NULL, 
	token BIGINT NULL, 
	attempts INTEGER NOT NULL, 
	last_error NVARCHAR(max) NULL, 
	created_at FLOAT(53) NOT NULL, 
	started_at FLOAT(53) NULL, 
	finished_at FLOAT(53) NULL, 
	expires_at FLOAT(53) NULL, 
	PRIMARY KEY (id)
);
CREATE INDEX ct_work_item_next_ix ON ct_work_item (namespace, worklist, state, exec_order, priority DESC, id);
CREATE TABLE ct_worklist (
	namespace NVARCHAR(100) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	name NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NOT NULL, 
	last_token BIGINT NOT NULL, 
	created_at FLOAT(53) NOT NULL, 
	CONSTRAINT ct_worklist_pk PRIMARY KEY (namespace, name)
);

-- ===== set_capacity: lock or create the resource row, then a grant pass (more capacity may admit waiters) =====
-- name: lock_resource_name
SELECT ct_resource.name 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1;
-- name: create_resource
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at, last_ticket) VALUES (:namespace, :name, :capacity, :last_token, (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0), :last_ticket);
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :ct_namespace AND ct_resource.name = :ct_name;
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: change_resource
UPDATE ct_resource SET capacity=:capacity WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT TOP 3 ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource = :ct_name_0 AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket) AS anon_1;

-- ===== acquire: lock the resource rows, enqueue under the next ticket, grant pass over holders and head =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :ct_namespace AND ct_resource.name = :ct_name;
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.holder = :ct_holder;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) OUTPUT inserted.id VALUES (:ct_w_namespace, :ct_w_resource, :ct_w_holder, :ct_w_request_key, :ct_w_slots, :ct_w_mode, :ct_w_state, :ct_w_lease_seconds, :ct_w_enqueued_at, :ct_w_expires_at, :ct_w_ticket, :ct_w_attempt, :ct_w_pickup_seconds, :ct_w_priority, :ct_w_queue_key);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT TOP 3 ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource = :ct_name_0 AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket) AS anon_1;
-- name: grant_waiter
UPDATE ct_request SET state=:ct_g_state, token=:ct_g_token, lease_seconds=:ct_g_lease, granted_at=:ct_g_now, expires_at=:ct_g_expires WHERE ct_request.id = :ct_g_id AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (:ct_h_namespace, :ct_h_resource, :ct_h_token, :ct_h_holder, :ct_h_mode, :ct_h_slots, :ct_h_priority, :ct_h_enqueued_at, :ct_h_granted_at, :ct_h_ended_at, :ct_h_outcome);
-- name: write_counters
UPDATE ct_resource SET last_token=:ct_c_last_token, last_ticket=:ct_c_last_ticket WHERE ct_resource.namespace = :ct_c_namespace AND ct_resource.name = :ct_c_name;

-- ===== try_acquire while held: read its own entry without locks, then enqueue as a waiter (ticketed FIFO) =====
-- name: peek
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key, (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS now, (SELECT TOP 1 wq.ticket 
FROM ct_request AS wq 
WHERE wq.namespace = ct_request.namespace AND wq.resource = ct_request.resource AND wq.state = 'waiting' AND wq.expires_at >= (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) ORDER BY wq.queue_key, wq.ticket) AS head_ticket, (SELECT min(hq.expires_at) AS min_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS hold_exp, (SELECT coalesce(sum(hq.slots), :coalesce_2) AS coalesce_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS used, (SELECT count(*) AS count_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted' AND hq.mode = :mode_1) AS excl, ct_resource.capacity, ct_resource.rate_count, ct_resource.rate_per 
FROM ct_request JOIN ct_resource ON ct_resource.namespace = ct_request.namespace AND ct_resource.name = ct_request.resource 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.holder = :ct_holder;
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :ct_namespace AND ct_resource.name = :ct_name;
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.holder = :ct_holder;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) OUTPUT inserted.id VALUES (:ct_w_namespace, :ct_w_resource, :ct_w_holder, :ct_w_request_key, :ct_w_slots, :ct_w_mode, :ct_w_state, :ct_w_lease_seconds, :ct_w_enqueued_at, :ct_w_expires_at, :ct_w_ticket, :ct_w_attempt, :ct_w_pickup_seconds, :ct_w_priority, :ct_w_queue_key);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT TOP 3 ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource = :ct_name_0 AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket) AS anon_1;
-- name: write_counters
UPDATE ct_resource SET last_token=:ct_c_last_token, last_ticket=:ct_c_last_ticket WHERE ct_resource.namespace = :ct_c_namespace AND ct_resource.name = :ct_c_name;
-- name: head_ticket
SELECT TOP 1 ct_request.ticket 
FROM ct_request 
WHERE ct_request.namespace = :namespace_1 AND ct_request.resource = :resource_1 AND ct_request.state = 'waiting' AND ct_request.expires_at >= (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) ORDER BY ct_request.queue_key, ct_request.ticket;

-- ===== renew a lease: extend on the database clock while granted and unexpired (fenced by key and attempt) =====
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: extend_lease
UPDATE ct_request SET lease_seconds=:lease_seconds, expires_at=:expires_at WHERE ct_request.request_key = :request_key_1 AND EXISTS (SELECT ct_request.attempt INTERSECT SELECT :ct_attempt) AND ct_request.state = 'granted' AND ct_request.expires_at >= :expires_at_1;
-- name: extend_lease
SELECT count(*) AS count_1 
FROM ct_request 
WHERE ct_request.request_key = :request_key_1 AND EXISTS (SELECT ct_request.attempt INTERSECT SELECT :ct_attempt) AND ct_request.state = 'granted' AND ct_request.expires_at = :expires_at_1;

-- ===== release a lease: lock the resource row, delete the entry, grant pass for the next in line =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :ct_namespace AND ct_resource.name = :ct_name;
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: release_rows
SELECT ct_request.id, ct_request.resource, ct_request.state, ct_request.token, ct_request.expires_at 
FROM ct_request 
WHERE ct_request.request_key = :ct_key AND EXISTS (SELECT ct_request.attempt INTERSECT SELECT :ct_attempt);
-- name: delete_release_rows
DELETE FROM ct_request WHERE ct_request.request_key = :ct_key AND EXISTS (SELECT ct_request.attempt INTERSECT SELECT :ct_attempt);
-- name: end_grant
UPDATE ct_grant_history SET ended_at=:ended_at, outcome=:outcome WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource = :resource_1 AND ct_grant_history.token = :token_1 AND ct_grant_history.outcome = 'held';
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT TOP 3 ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource = :ct_name_0 AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket) AS anon_1;
-- name: grant_waiter
UPDATE ct_request SET state=:ct_g_state, token=:ct_g_token, granted_at=:ct_g_now, expires_at=:ct_g_expires WHERE ct_request.id = :ct_g_id AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (:ct_h_namespace, :ct_h_resource, :ct_h_token, :ct_h_holder, :ct_h_mode, :ct_h_slots, :ct_h_priority, :ct_h_enqueued_at, :ct_h_granted_at, :ct_h_ended_at, :ct_h_outcome);
-- name: write_counters
UPDATE ct_resource SET last_token=:ct_c_last_token, last_ticket=:ct_c_last_ticket WHERE ct_resource.namespace = :ct_c_namespace AND ct_resource.name = :ct_c_name;

-- ===== release a grant released already (another lease of it): the grant history says how it ended =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :ct_namespace AND ct_resource.name = :ct_name;
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: release_rows
SELECT ct_request.id, ct_request.resource, ct_request.state, ct_request.token, ct_request.expires_at 
FROM ct_request 
WHERE ct_request.request_key = :ct_key AND EXISTS (SELECT ct_request.attempt INTERSECT SELECT :ct_attempt);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT TOP 3 ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource = :ct_name_0 AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket) AS anon_1;
-- name: grant_outcomes
SELECT ct_grant_history.resource, ct_grant_history.token, ct_grant_history.outcome 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource IN (:resource_1_1) AND ct_grant_history.token IN (:token_1_1);

-- ===== status: resources, holders and waiters (no locks) =====
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: resources
SELECT ct_resource.namespace, ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.created_at, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging 
FROM ct_resource 
WHERE ct_resource.namespace = :namespace_1 ORDER BY ct_resource.name;
-- name: requests
SELECT ct_request.id, ct_request.namespace, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.lease_seconds, ct_request.enqueued_at, ct_request.granted_at, ct_request.expires_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.priority, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :namespace_1 ORDER BY ct_request.resource, ct_request.ticket;

-- ===== reap: resources with entries expired on the database clock (each then reaped under its lock) =====
-- name: expired_resources
SELECT DISTINCT ct_request.resource 
FROM ct_request 
WHERE ct_request.namespace = :namespace_1 AND ct_request.expires_at < (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0);

-- ===== expiry: an expired holder or waiter is deleted with its expiry re-checked (on SQL Server the DELETE returns the ids it removed: the row count is never trusted) =====
-- name: lock_resource_name
SELECT ct_resource.name 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1;
-- name: create_resource
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at, last_ticket) VALUES (:namespace, :name, :capacity, :last_token, (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0), :last_ticket);
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :ct_namespace AND ct_resource.name = :ct_name;
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: change_resource
UPDATE ct_resource SET capacity=:capacity WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT TOP 3 ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource = :ct_name_0 AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket) AS anon_1;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.holder = :ct_holder;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) OUTPUT inserted.id VALUES (:ct_w_namespace, :ct_w_resource, :ct_w_holder, :ct_w_request_key, :ct_w_slots, :ct_w_mode, :ct_w_state, :ct_w_lease_seconds, :ct_w_enqueued_at, :ct_w_expires_at, :ct_w_ticket, :ct_w_attempt, :ct_w_pickup_seconds, :ct_w_priority, :ct_w_queue_key);
-- name: grant_waiter
UPDATE ct_request SET state=:ct_g_state, token=:ct_g_token, lease_seconds=:ct_g_lease, granted_at=:ct_g_now, expires_at=:ct_g_expires WHERE ct_request.id = :ct_g_id AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (:ct_h_namespace, :ct_h_resource, :ct_h_token, :ct_h_holder, :ct_h_mode, :ct_h_slots, :ct_h_priority, :ct_h_enqueued_at, :ct_h_granted_at, :ct_h_ended_at, :ct_h_outcome);
-- name: write_counters
UPDATE ct_resource SET last_token=:ct_c_last_token, last_ticket=:ct_c_last_ticket WHERE ct_resource.namespace = :ct_c_namespace AND ct_resource.name = :ct_c_name;
-- name: peek
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key, (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS now, (SELECT TOP 1 wq.ticket 
FROM ct_request AS wq 
WHERE wq.namespace = ct_request.namespace AND wq.resource = ct_request.resource AND wq.state = 'waiting' AND wq.expires_at >= (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) ORDER BY wq.queue_key, wq.ticket) AS head_ticket, (SELECT min(hq.expires_at) AS min_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS hold_exp, (SELECT coalesce(sum(hq.slots), :coalesce_2) AS coalesce_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS used, (SELECT count(*) AS count_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted' AND hq.mode = :mode_1) AS excl, ct_resource.capacity, ct_resource.rate_count, ct_resource.rate_per 
FROM ct_request JOIN ct_resource ON ct_resource.namespace = ct_request.namespace AND ct_resource.name = ct_request.resource 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.holder = :ct_holder;
-- name: head_ticket
SELECT TOP 1 ct_request.ticket 
FROM ct_request 
WHERE ct_request.namespace = :namespace_1 AND ct_request.resource = :resource_1 AND ct_request.state = 'waiting' AND ct_request.expires_at >= (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) ORDER BY ct_request.queue_key, ct_request.ticket;
-- name: delete_expired_request
DELETE FROM ct_request OUTPUT deleted.id WHERE ct_request.request_key = :request_key_1 AND ct_request.expires_at < :expires_at_1;
-- name: delete_requests
DELETE FROM ct_request WHERE ct_request.request_key = :request_key_1;
-- name: end_grant
UPDATE ct_grant_history SET ended_at=:ended_at, outcome=:outcome WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource = :resource_1 AND ct_grant_history.token = :token_1 AND ct_grant_history.outcome = 'held';
-- name: delete_expired_row
DELETE FROM ct_request OUTPUT deleted.id WHERE ct_request.id = :id_1 AND ct_request.expires_at < :expires_at_1;
-- name: expired_resources
SELECT DISTINCT ct_request.resource 
FROM ct_request 
WHERE ct_request.namespace = :namespace_1 AND ct_request.expires_at < (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0);
-- name: delete_expired_waiters
DELETE FROM ct_request OUTPUT deleted.id WHERE ct_request.namespace = :namespace_1 AND ct_request.resource IN (:resource_1_1) AND ct_request.state = 'waiting' AND ct_request.expires_at < :expires_at_1;

-- ===== set_capacity with a rate limit and aging (rewrites the waiters' queue order) =====
-- name: lock_resource_name
SELECT ct_resource.name 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1;
-- name: create_resource
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at, last_ticket) VALUES (:namespace, :name, :capacity, :last_token, (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0), :last_ticket);
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :ct_namespace AND ct_resource.name = :ct_name;
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: reorder_queue
UPDATE ct_request SET queue_key=(ct_request.enqueued_at - ct_request.priority * :priority_1) WHERE ct_request.namespace = :namespace_1 AND ct_request.resource = :resource_1 AND ct_request.state = 'waiting';
-- name: change_resource
UPDATE ct_resource SET capacity=:capacity, rate_count=:rate_count, rate_per=:rate_per, aging=:aging WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1;
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT TOP 3 ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource = :ct_name_0 AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket) AS anon_1;
-- name: window_count
SELECT count(*) AS count_1 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource = :resource_1 AND ct_grant_history.granted_at > :granted_at_1;

-- ===== rate-limited grants: the window's budget from the grant history; the head times the next opening =====
-- name: lock_resource
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.last_ticket, ct_resource.rate_count, ct_resource.rate_per, ct_resource.aging, 1 AS epoch 
FROM ct_resource WITH (UPDLOCK, ROWLOCK) 
WHERE ct_resource.namespace = :ct_namespace AND ct_resource.name = :ct_name;
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: holder_rows
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.holder = :ct_holder;
-- name: insert_waiter
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at, ticket, attempt, pickup_seconds, priority, queue_key) OUTPUT inserted.id VALUES (:ct_w_namespace, :ct_w_resource, :ct_w_holder, :ct_w_request_key, :ct_w_slots, :ct_w_mode, :ct_w_state, :ct_w_lease_seconds, :ct_w_enqueued_at, :ct_w_expires_at, :ct_w_ticket, :ct_w_attempt, :ct_w_pickup_seconds, :ct_w_priority, :ct_w_queue_key);
-- name: snapshot
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.state = 'granted' UNION ALL SELECT anon_1.id, anon_1.resource, anon_1.holder, anon_1.request_key, anon_1.slots, anon_1.mode, anon_1.state, anon_1.token, anon_1.expires_at, anon_1.granted_at, anon_1.ticket, anon_1.attempt, anon_1.pickup_seconds, anon_1.lease_seconds, anon_1.priority, anon_1.enqueued_at, anon_1.queue_key 
FROM (SELECT TOP 3 ct_request.id AS id, ct_request.resource AS resource, ct_request.holder AS holder, ct_request.request_key AS request_key, ct_request.slots AS slots, ct_request.mode AS mode, ct_request.state AS state, ct_request.token AS token, ct_request.expires_at AS expires_at, ct_request.granted_at AS granted_at, ct_request.ticket AS ticket, ct_request.attempt AS attempt, ct_request.pickup_seconds AS pickup_seconds, ct_request.lease_seconds AS lease_seconds, ct_request.priority AS priority, ct_request.enqueued_at AS enqueued_at, ct_request.queue_key AS queue_key 
FROM ct_request 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource = :ct_name_0 AND ct_request.state = 'waiting' ORDER BY ct_request.queue_key, ct_request.ticket) AS anon_1;
-- name: window_count
SELECT count(*) AS count_1 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource = :resource_1 AND ct_grant_history.granted_at > :granted_at_1;
-- name: grant_waiter
UPDATE ct_request SET state=:ct_g_state, token=:ct_g_token, lease_seconds=:ct_g_lease, granted_at=:ct_g_now, expires_at=:ct_g_expires WHERE ct_request.id = :ct_g_id AND ct_request.state = 'waiting';
-- name: record_grant
INSERT INTO ct_grant_history (namespace, resource, token, holder, mode, slots, priority, enqueued_at, granted_at, ended_at, outcome) VALUES (:ct_h_namespace, :ct_h_resource, :ct_h_token, :ct_h_holder, :ct_h_mode, :ct_h_slots, :ct_h_priority, :ct_h_enqueued_at, :ct_h_granted_at, :ct_h_ended_at, :ct_h_outcome);
-- name: write_counters
UPDATE ct_resource SET last_token=:ct_c_last_token, last_ticket=:ct_c_last_ticket WHERE ct_resource.namespace = :ct_c_namespace AND ct_resource.name = :ct_c_name;
-- name: release_rows
SELECT ct_request.id, ct_request.resource, ct_request.state, ct_request.token, ct_request.expires_at 
FROM ct_request 
WHERE ct_request.request_key = :ct_key AND EXISTS (SELECT ct_request.attempt INTERSECT SELECT :ct_attempt);
-- name: delete_release_rows
DELETE FROM ct_request WHERE ct_request.request_key = :ct_key AND EXISTS (SELECT ct_request.attempt INTERSECT SELECT :ct_attempt);
-- name: end_grant
UPDATE ct_grant_history SET ended_at=:ended_at, outcome=:outcome WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource = :resource_1 AND ct_grant_history.token = :token_1 AND ct_grant_history.outcome = 'held';
-- name: peek
SELECT ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at, ct_request.ticket, ct_request.attempt, ct_request.pickup_seconds, ct_request.lease_seconds, ct_request.priority, ct_request.enqueued_at, ct_request.queue_key, (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS now, (SELECT TOP 1 wq.ticket 
FROM ct_request AS wq 
WHERE wq.namespace = ct_request.namespace AND wq.resource = ct_request.resource AND wq.state = 'waiting' AND wq.expires_at >= (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) ORDER BY wq.queue_key, wq.ticket) AS head_ticket, (SELECT min(hq.expires_at) AS min_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS hold_exp, (SELECT coalesce(sum(hq.slots), :coalesce_2) AS coalesce_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted') AS used, (SELECT count(*) AS count_1 
FROM ct_request AS hq 
WHERE hq.namespace = ct_request.namespace AND hq.resource = ct_request.resource AND hq.state = 'granted' AND hq.mode = :mode_1) AS excl, ct_resource.capacity, ct_resource.rate_count, ct_resource.rate_per 
FROM ct_request JOIN ct_resource ON ct_resource.namespace = ct_request.namespace AND ct_resource.name = ct_request.resource 
WHERE ct_request.namespace = :ct_namespace AND ct_request.resource IN (:ct_names_1) AND ct_request.holder = :ct_holder;
-- name: head_ticket
SELECT TOP 1 ct_request.ticket 
FROM ct_request 
WHERE ct_request.namespace = :namespace_1 AND ct_request.resource = :resource_1 AND ct_request.state = 'waiting' AND ct_request.expires_at >= (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) ORDER BY ct_request.queue_key, ct_request.ticket;
-- name: refresh_waiter
UPDATE ct_request SET expires_at=:expires_at, pickup_seconds=:pickup_seconds WHERE ct_request.request_key = :request_key_1 AND ct_request.state = 'waiting' AND ct_request.expires_at >= :expires_at_1;
-- name: refresh_waiter
SELECT count(*) AS count_1 
FROM ct_request 
WHERE ct_request.request_key = :request_key_1 AND ct_request.state = 'waiting' AND ct_request.expires_at = :expires_at_1;
-- name: window_times
SELECT ct_grant_history.granted_at 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource = :resource_1 AND ct_grant_history.granted_at > :granted_at_1 ORDER BY ct_grant_history.granted_at;

-- ===== grant history (newest first) =====
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: records
SELECT TOP 1000 ct_grant_history.namespace, ct_grant_history.resource, ct_grant_history.token, ct_grant_history.holder, ct_grant_history.mode, ct_grant_history.slots, ct_grant_history.priority, ct_grant_history.enqueued_at, ct_grant_history.granted_at, ct_grant_history.ended_at, ct_grant_history.outcome 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.granted_at >= :granted_at_1 AND ct_grant_history.resource = :resource_1 ORDER BY ct_grant_history.granted_at DESC, ct_grant_history.token DESC;

-- ===== stats and stats_series from the grant history =====
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: capacities
SELECT ct_resource.name, ct_resource.capacity 
FROM ct_resource 
WHERE ct_resource.namespace = :namespace_1 ORDER BY ct_resource.name;
-- name: overlapping
SELECT ct_grant_history.slots, ct_grant_history.enqueued_at, ct_grant_history.granted_at, ct_grant_history.ended_at, ct_grant_history.outcome 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource = :resource_1 AND ct_grant_history.granted_at < :granted_at_1 AND (ct_grant_history.ended_at IS NULL OR ct_grant_history.ended_at > :ended_at_1);
-- name: capacity_of
SELECT ct_resource.capacity 
FROM ct_resource 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1;

-- ===== prune_history (batches per resource) =====
-- name: resource_names
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = :namespace_1;
-- name: rate_period
SELECT ct_resource.rate_per 
FROM ct_resource 
WHERE ct_resource.namespace = :namespace_1 AND ct_resource.name = :name_1;
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: prune_edge
SELECT ct_grant_history.granted_at 
FROM ct_grant_history 
WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource = :resource_1 AND ct_grant_history.granted_at < :granted_at_1 AND ct_grant_history.outcome != 'held' ORDER BY ct_grant_history.granted_at
 OFFSET :param_2 ROWS
 FETCH FIRST :param_3 ROWS ONLY;
-- name: delete_ended
DELETE FROM ct_grant_history OUTPUT deleted.token WHERE ct_grant_history.namespace = :namespace_1 AND ct_grant_history.resource = :resource_1 AND ct_grant_history.granted_at < :granted_at_1 AND ct_grant_history.outcome != 'held';

-- ===== events prepare (introspection) =====

-- ===== events prepare: claim columns, claim indexes, statistics (DDL) =====
-- each statement runs in a transaction of its own, after a lock timeout for DDL
-- (Oracle DDL_LOCK_TIMEOUT, PostgreSQL lock_timeout, MySQL lock_wait_timeout, SQL Server LOCK_TIMEOUT);
-- indexes are built online where the server offers it (PostgreSQL CONCURRENTLY, SQL Server and
-- Oracle Enterprise Edition: WITH (ONLINE = ON) / ONLINE appended to CREATE INDEX).
-- SQL Server: plain indexes by default. prepare(filtered_indexes=True) makes them filtered
-- (WHERE ct_state = 0 / 1): smaller, but then every INSERT, UPDATE and DELETE on this table
-- fails (error 1934) in sessions with QUOTED_IDENTIFIER or ANSI_NULLS OFF.
-- prepare(disable_lock_escalation=True) adds ALTER TABLE ... SET (LOCK_ESCALATION = DISABLE).
ALTER TABLE events ADD ct_state SMALLINT NULL DEFAULT '0';
ALTER TABLE events ADD ct_owner NVARCHAR(200) COLLATE Latin1_General_100_BIN2 NULL;
ALTER TABLE events ADD ct_token BIGINT NULL;
ALTER TABLE events ADD ct_expires_at FLOAT(53) NULL;
ALTER TABLE events ADD ct_available_at FLOAT(53) NULL;
ALTER TABLE events ADD ct_attempts INTEGER NULL DEFAULT '0';
ALTER TABLE events ADD ct_error NVARCHAR(2000) NULL;
ALTER TABLE events ADD ct_done_at FLOAT(53) NULL;
CREATE INDEX ct_claim_events ON events (ct_state, event_id) INCLUDE (ct_available_at, ct_expires_at);
CREATE INDEX ct_token_events ON events (ct_token);
UPDATE events SET ct_state=0, ct_attempts=0 WHERE events.event_id IN (SELECT TOP 1000 events.event_id 
FROM events 
WHERE events.ct_state IS NULL) AND events.ct_state IS NULL  -- repeated, one transaction per batch, until no row has ct_state NULL;
UPDATE STATISTICS events;

-- ===== events claim: one short transaction that skips rows other workers hold =====
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: backfill_batch
-- mssql: the claim counters were added nullable (a metadata-only ADD on every edition): NULLs are set in batches under the lock-escalation threshold, the target repeating IS NULL for RCSI; READPAST passes over rows a producer is still inserting
UPDATE events SET ct_state=:ct_state, ct_attempts=:ct_attempts WHERE events.event_id IN (SELECT TOP 1000 events.event_id 
FROM events WITH (UPDLOCK, ROWLOCK, READPAST) 
WHERE events.ct_state IS NULL) AND events.ct_state IS NULL;
-- name: claim_select
-- mssql: table hints UPDLOCK, ROWLOCK, READPAST (SQLAlchemy drops FOR UPDATE there), FORCESEEK once the claim index exists, TOP capped under the 5,000-lock escalation threshold
SELECT TOP 5 events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events WITH (UPDLOCK, ROWLOCK, READPAST, FORCESEEK) 
WHERE events.ct_state = 1 AND events.ct_expires_at < :ct_expires_at_1 ORDER BY events.event_id;
-- name: claim_select
-- mssql: table hints UPDLOCK, ROWLOCK, READPAST (SQLAlchemy drops FOR UPDATE there), FORCESEEK once the claim index exists, TOP capped under the 5,000-lock escalation threshold
SELECT TOP 5 events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events WITH (UPDLOCK, ROWLOCK, READPAST, FORCESEEK) 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= :ct_available_at_1) ORDER BY events.event_id;
-- name: update_keys
-- mssql: OPTION (TABLE HINT(..., FORCESEEK)): an UPDATE's scan would take U locks on rows other workers hold; key lists padded to 1, 2, 4 ... 900 keys for the plan cache
UPDATE events SET ct_state=:ct_state, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_attempts=(coalesce(events.ct_attempts, :coalesce_1) + :coalesce_2) WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5, :event_id_1_6, :event_id_1_7, :event_id_1_8) AND events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= :ct_available_at_1) OPTION (TABLE HINT(events, FORCESEEK));
-- name: keys_where
-- mssql: UPDLOCK, ROWLOCK with FORCESEEK when locking, FORCESEEK alone otherwise: rows counted by a select in the same transaction: triggers or NOCOUNT change the reported row count
SELECT events.event_id 
FROM events WITH (FORCESEEK) 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5, :event_id_1_6, :event_id_1_7, :event_id_1_8) AND events.ct_token = :ct_token_1 AND events.ct_state = 1;

-- ===== batch complete (fenced on the batch token) =====
-- name: update_keys
-- mssql: OPTION (TABLE HINT(..., FORCESEEK)): an UPDATE's scan would take U locks on rows other workers hold; key lists padded to 1, 2, 4 ... 900 keys for the plan cache
UPDATE events SET ct_state=:ct_state, ct_expires_at=:ct_expires_at, ct_error=:ct_error, ct_done_at=(DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5, :event_id_1_6, :event_id_1_7, :event_id_1_8) AND events.ct_token = :ct_token_1 AND events.ct_state = 1 OPTION (TABLE HINT(events, FORCESEEK));
-- name: keys_where
-- mssql: UPDLOCK, ROWLOCK with FORCESEEK when locking, FORCESEEK alone otherwise: rows counted by a select in the same transaction: triggers or NOCOUNT change the reported row count
SELECT events.event_id 
FROM events WITH (FORCESEEK) 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5, :event_id_1_6, :event_id_1_7, :event_id_1_8) AND events.ct_token = :ct_token_1 AND events.ct_state = 2;

-- ===== batch fail (back-off or error state, decided from the stored attempts) =====
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: backfill_batch
-- mssql: the claim counters were added nullable (a metadata-only ADD on every edition): NULLs are set in batches under the lock-escalation threshold, the target repeating IS NULL for RCSI; READPAST passes over rows a producer is still inserting
UPDATE events SET ct_state=:ct_state, ct_attempts=:ct_attempts WHERE events.event_id IN (SELECT TOP 1000 events.event_id 
FROM events WITH (UPDLOCK, ROWLOCK, READPAST) 
WHERE events.ct_state IS NULL) AND events.ct_state IS NULL;
-- name: claim_select
-- mssql: table hints UPDLOCK, ROWLOCK, READPAST (SQLAlchemy drops FOR UPDATE there), FORCESEEK once the claim index exists, TOP capped under the 5,000-lock escalation threshold
SELECT TOP 5 events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events WITH (UPDLOCK, ROWLOCK, READPAST, FORCESEEK) 
WHERE events.ct_state = 1 AND events.ct_expires_at < :ct_expires_at_1 ORDER BY events.event_id;
-- name: claim_select
-- mssql: table hints UPDLOCK, ROWLOCK, READPAST (SQLAlchemy drops FOR UPDATE there), FORCESEEK once the claim index exists, TOP capped under the 5,000-lock escalation threshold
SELECT TOP 5 events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events WITH (UPDLOCK, ROWLOCK, READPAST, FORCESEEK) 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= :ct_available_at_1) ORDER BY events.event_id;
-- name: update_keys
-- mssql: OPTION (TABLE HINT(..., FORCESEEK)): an UPDATE's scan would take U locks on rows other workers hold; key lists padded to 1, 2, 4 ... 900 keys for the plan cache
UPDATE events SET ct_state=:ct_state, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_attempts=(coalesce(events.ct_attempts, :coalesce_1) + :coalesce_2) WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5, :event_id_1_6, :event_id_1_7, :event_id_1_8) AND events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= :ct_available_at_1) OPTION (TABLE HINT(events, FORCESEEK));
-- name: keys_where
-- mssql: UPDLOCK, ROWLOCK with FORCESEEK when locking, FORCESEEK alone otherwise: rows counted by a select in the same transaction: triggers or NOCOUNT change the reported row count
SELECT events.event_id 
FROM events WITH (FORCESEEK) 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5, :event_id_1_6, :event_id_1_7, :event_id_1_8) AND events.ct_token = :ct_token_1 AND events.ct_state = 1;
-- name: keys_where
-- mssql: UPDLOCK, ROWLOCK with FORCESEEK when locking, FORCESEEK alone otherwise: rows counted by a select in the same transaction: triggers or NOCOUNT change the reported row count
SELECT events.event_id 
FROM events WITH (UPDLOCK, ROWLOCK, FORCESEEK) 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5, :event_id_1_6, :event_id_1_7, :event_id_1_8) AND events.ct_token = :ct_token_1 AND events.ct_state = 1;
-- name: update_keys
-- mssql: OPTION (TABLE HINT(..., FORCESEEK)): an UPDATE's scan would take U locks on rows other workers hold; key lists padded to 1, 2, 4 ... 900 keys for the plan cache
UPDATE events SET ct_state=CASE WHEN (events.ct_attempts >= :ct_attempts_1) THEN :param_1 ELSE :param_2 END, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_available_at=CASE WHEN (events.ct_attempts >= :ct_attempts_1) THEN NULL WHEN (events.ct_attempts <= :ct_attempts_2) THEN (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) + :param_3 WHEN (events.ct_attempts <= :ct_attempts_3) THEN (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) + :param_4 WHEN (events.ct_attempts <= :ct_attempts_4) THEN (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) + :param_5 WHEN (events.ct_attempts <= :ct_attempts_5) THEN (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) + :param_6 ELSE (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) + :param_7 END, ct_error=:ct_error WHERE events.event_id IN (:event_id_1_1, :event_id_1_2, :event_id_1_3, :event_id_1_4, :event_id_1_5, :event_id_1_6, :event_id_1_7, :event_id_1_8) AND events.ct_token = :ct_token_1 AND events.ct_state = 1 OPTION (TABLE HINT(events, FORCESEEK));

-- ===== batch renew and release =====
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: backfill_batch
-- mssql: the claim counters were added nullable (a metadata-only ADD on every edition): NULLs are set in batches under the lock-escalation threshold, the target repeating IS NULL for RCSI; READPAST passes over rows a producer is still inserting
UPDATE events SET ct_state=:ct_state, ct_attempts=:ct_attempts WHERE events.event_id IN (SELECT TOP 1000 events.event_id 
FROM events WITH (UPDLOCK, ROWLOCK, READPAST) 
WHERE events.ct_state IS NULL) AND events.ct_state IS NULL;
-- name: claim_select
-- mssql: table hints UPDLOCK, ROWLOCK, READPAST (SQLAlchemy drops FOR UPDATE there), FORCESEEK once the claim index exists, TOP capped under the 5,000-lock escalation threshold
SELECT TOP 2 events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events WITH (UPDLOCK, ROWLOCK, READPAST, FORCESEEK) 
WHERE events.ct_state = 1 AND events.ct_expires_at < :ct_expires_at_1 ORDER BY events.event_id;
-- name: claim_select
-- mssql: table hints UPDLOCK, ROWLOCK, READPAST (SQLAlchemy drops FOR UPDATE there), FORCESEEK once the claim index exists, TOP capped under the 5,000-lock escalation threshold
SELECT TOP 2 events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events WITH (UPDLOCK, ROWLOCK, READPAST, FORCESEEK) 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= :ct_available_at_1) ORDER BY events.event_id;
-- name: update_keys
-- mssql: OPTION (TABLE HINT(..., FORCESEEK)): an UPDATE's scan would take U locks on rows other workers hold; key lists padded to 1, 2, 4 ... 900 keys for the plan cache
UPDATE events SET ct_state=:ct_state, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_attempts=(coalesce(events.ct_attempts, :coalesce_1) + :coalesce_2) WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= :ct_available_at_1) OPTION (TABLE HINT(events, FORCESEEK));
-- name: keys_where
-- mssql: UPDLOCK, ROWLOCK with FORCESEEK when locking, FORCESEEK alone otherwise: rows counted by a select in the same transaction: triggers or NOCOUNT change the reported row count
SELECT events.event_id 
FROM events WITH (FORCESEEK) 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_token = :ct_token_1 AND events.ct_state = 1;
-- name: keys_where
-- mssql: UPDLOCK, ROWLOCK with FORCESEEK when locking, FORCESEEK alone otherwise: rows counted by a select in the same transaction: triggers or NOCOUNT change the reported row count
SELECT events.event_id 
FROM events WITH (UPDLOCK, ROWLOCK, FORCESEEK) 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_token = :ct_token_1 AND events.ct_state = 1 AND events.ct_expires_at >= :ct_expires_at_1;
-- name: update_keys
-- mssql: OPTION (TABLE HINT(..., FORCESEEK)): an UPDATE's scan would take U locks on rows other workers hold; key lists padded to 1, 2, 4 ... 900 keys for the plan cache
UPDATE events SET ct_expires_at=:ct_expires_at WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_token = :ct_token_1 AND events.ct_state = 1 OPTION (TABLE HINT(events, FORCESEEK));
-- name: keys_where
-- mssql: UPDLOCK, ROWLOCK with FORCESEEK when locking, FORCESEEK alone otherwise: rows counted by a select in the same transaction: triggers or NOCOUNT change the reported row count
SELECT events.event_id 
FROM events WITH (UPDLOCK, ROWLOCK, FORCESEEK) 
WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_token = :ct_token_1 AND events.ct_state = 1;
-- name: update_keys
-- mssql: OPTION (TABLE HINT(..., FORCESEEK)): an UPDATE's scan would take U locks on rows other workers hold; key lists padded to 1, 2, 4 ... 900 keys for the plan cache
UPDATE events SET ct_state=:ct_state, ct_owner=:ct_owner, ct_token=:ct_token, ct_expires_at=:ct_expires_at, ct_attempts=CASE WHEN (events.ct_attempts > :ct_attempts_1) THEN events.ct_attempts - :ct_attempts_2 ELSE :param_1 END WHERE events.event_id IN (:event_id_1_1, :event_id_1_2) AND events.ct_token = :ct_token_1 AND events.ct_state = 1 OPTION (TABLE HINT(events, FORCESEEK));

-- ===== events stats =====
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: counts_by_state
-- mssql: COALESCE: a row a metadata-only prepare() has not set yet (state NULL) counts as pending
SELECT coalesce(events.ct_state, 0) AS coalesce_1, count(*) AS count_1 
FROM events GROUP BY coalesce(events.ct_state, 0);
-- name: count_expired
SELECT count(*) AS count_1 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < :ct_expires_at_1;
-- name: oldest_pending
SELECT TOP 1 events.event_id 
FROM events 
WHERE events.ct_state = 0 ORDER BY events.event_id;

-- ===== events error rows (the status page) =====
-- name: error_rows
SELECT TOP 20 events.event_id, events.ct_attempts, events.ct_error 
FROM events 
WHERE events.ct_state = 3 ORDER BY events.event_id;

-- ===== events retry_errors =====
-- name: page_keys
-- mssql: paged by key under the lock-escalation threshold; FORCESEEK from the second page on (the first has no seek predicate: error 8622)
SELECT TOP 1000 events.event_id 
FROM events WITH (UPDLOCK, ROWLOCK) 
WHERE events.ct_state = 3 ORDER BY events.event_id;

-- ===== worklist populate =====
-- name: lock_list
-- mssql: table hints WITH (UPDLOCK, ROWLOCK): SQLAlchemy's SQL Server dialect drops FOR UPDATE
SELECT ct_worklist.last_token, 1 AS epoch 
FROM ct_worklist WITH (UPDLOCK, ROWLOCK) 
WHERE ct_worklist.namespace = :namespace_1 AND ct_worklist.name = :name_1;
-- name: create_list
INSERT INTO ct_worklist (namespace, name, last_token, created_at) VALUES (:namespace, :name, :last_token, (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0));
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: insert_items
INSERT INTO ct_work_item (namespace, worklist, exec_order, priority, payload, state, attempts, created_at) OUTPUT inserted.id VALUES (:namespace, :worklist, :exec_order, :priority, :payload, :state, :attempts, :created_at);

-- ===== worklist allocate: lock the work list row, lowest unfinished order only =====
-- name: lock_list
-- mssql: table hints WITH (UPDLOCK, ROWLOCK): SQLAlchemy's SQL Server dialect drops FOR UPDATE
SELECT ct_worklist.last_token, 1 AS epoch 
FROM ct_worklist WITH (UPDLOCK, ROWLOCK) 
WHERE ct_worklist.namespace = :namespace_1 AND ct_worklist.name = :name_1;
-- name: current_order
SELECT min(ct_work_item.exec_order) AS [current], (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS now 
FROM ct_work_item 
WHERE ct_work_item.namespace = :namespace_1 AND ct_work_item.worklist = :worklist_1 AND ct_work_item.state IN ('new', 'active', 'error');
-- name: next_item
SELECT anon_1.id, anon_1.payload, anon_1.exec_order, anon_1.priority, anon_1.attempts, anon_1.state, anon_1.token 
FROM (SELECT TOP 1 ct_work_item.id AS id, ct_work_item.payload AS payload, ct_work_item.exec_order AS exec_order, ct_work_item.priority AS priority, ct_work_item.attempts AS attempts, ct_work_item.state AS state, ct_work_item.token AS token 
FROM ct_work_item 
WHERE ct_work_item.namespace = :namespace_1 AND ct_work_item.worklist = :worklist_1 AND ct_work_item.state = 'new' AND ct_work_item.exec_order = :exec_order_1 ORDER BY ct_work_item.priority DESC, ct_work_item.id) AS anon_1 UNION ALL SELECT anon_2.id, anon_2.payload, anon_2.exec_order, anon_2.priority, anon_2.attempts, anon_2.state, anon_2.token 
FROM (SELECT TOP 1 ct_work_item.id AS id, ct_work_item.payload AS payload, ct_work_item.exec_order AS exec_order, ct_work_item.priority AS priority, ct_work_item.attempts AS attempts, ct_work_item.state AS state, ct_work_item.token AS token 
FROM ct_work_item 
WHERE ct_work_item.namespace = :namespace_2 AND ct_work_item.worklist = :worklist_2 AND ct_work_item.state = 'active' AND ct_work_item.exec_order = :exec_order_2 AND ct_work_item.expires_at < :expires_at_1 ORDER BY ct_work_item.priority DESC, ct_work_item.id) AS anon_2;
-- name: allocate_item
UPDATE ct_work_item SET state=:state, owner=:owner, token=:token, attempts=(ct_work_item.attempts + :attempts_1), started_at=:started_at, finished_at=:finished_at, expires_at=:expires_at WHERE ct_work_item.id = :id_1 AND ct_work_item.state = 'new';
-- name: count_allocated
-- mssql: confirms the allocation: a trigger or server-wide NOCOUNT changes the row count the driver reports
SELECT count(*) AS count_1 
FROM ct_work_item 
WHERE ct_work_item.id = :id_1 AND ct_work_item.token = :token_1 AND ct_work_item.state = 'active' AND ct_work_item.started_at = :started_at_1;
-- name: set_last_token
UPDATE ct_worklist SET last_token=:last_token WHERE ct_worklist.namespace = :namespace_1 AND ct_worklist.name = :name_1;

-- ===== work item complete (fenced on the item token) =====
-- name: finish
UPDATE ct_work_item SET state=:state, last_error=:last_error, finished_at=(DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0), expires_at=:expires_at WHERE ct_work_item.id = :id_1 AND ct_work_item.token = :token_1 AND ct_work_item.state = 'active';
-- name: count_finished
-- mssql: confirms the finish: a trigger or server-wide NOCOUNT changes the row count the driver reports
SELECT count(*) AS count_1 
FROM ct_work_item 
WHERE ct_work_item.id = :id_1 AND ct_work_item.token = :token_1 AND ct_work_item.state = 'done';

-- ===== worklist status =====
-- name: read_now
SELECT (DATEDIFF_BIG(MICROSECOND, '19700101', SYSUTCDATETIME()) / 1000000.0) AS db_now_1;
-- name: counts
SELECT ct_work_item.exec_order, ct_work_item.state, count(*) AS count_1, sum(CASE WHEN (ct_work_item.state = 'active' AND ct_work_item.expires_at < :expires_at_1) THEN :param_2 ELSE :param_3 END) AS sum_1 
FROM ct_work_item 
WHERE ct_work_item.namespace = :namespace_1 AND ct_work_item.worklist = :worklist_1 GROUP BY ct_work_item.exec_order, ct_work_item.state ORDER BY ct_work_item.exec_order;
