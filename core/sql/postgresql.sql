-- controltable: DDL and statements for postgresql (server version 15.0)
-- Run the DDL once with DDL rights (or `controltable init`); afterwards the engine needs DML only
-- (SELECT, INSERT, UPDATE, DELETE on the tables below and on your event tables).

-- ===== control tables =====
CREATE TABLE ct_meta (
	key VARCHAR(64) NOT NULL, 
	value VARCHAR(255) NOT NULL, 
	PRIMARY KEY (key)
);
CREATE TABLE ct_request (
	id BIGSERIAL NOT NULL, 
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
	PRIMARY KEY (id), 
	CONSTRAINT ct_request_holder_uq UNIQUE (namespace, resource, holder)
);
CREATE INDEX ct_request_key_ix ON ct_request (request_key);
CREATE INDEX ct_request_queue_ix ON ct_request (namespace, resource, id);
CREATE TABLE ct_resource (
	namespace VARCHAR(100) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	capacity INTEGER NOT NULL, 
	last_token BIGINT NOT NULL, 
	created_at FLOAT(53) NOT NULL, 
	CONSTRAINT ct_resource_pk PRIMARY KEY (namespace, name)
);
CREATE TABLE ct_work_item (
	id BIGSERIAL NOT NULL, 
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
);
CREATE INDEX ct_work_item_ix ON ct_work_item (namespace, worklist, state, exec_order);
CREATE TABLE ct_worklist (
	namespace VARCHAR(100) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	last_token BIGINT NOT NULL, 
	created_at FLOAT(53) NOT NULL, 
	CONSTRAINT ct_worklist_pk PRIMARY KEY (namespace, name)
);

-- ===== set_capacity (create or resize a resource) =====
SELECT ct_resource.name 
FROM ct_resource 
WHERE ct_resource.namespace = %(namespace_1)s::VARCHAR AND ct_resource.name = %(name_1)s::VARCHAR FOR UPDATE;
INSERT INTO ct_resource (namespace, name, capacity, last_token, created_at) VALUES (%(namespace)s::VARCHAR, %(name)s::VARCHAR, %(capacity)s::INTEGER, %(last_token)s::BIGINT, CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION));

-- ===== acquire: lock the resource row, reap expired entries, read the queue, grant =====
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token 
FROM ct_resource 
WHERE ct_resource.namespace = %(namespace_1)s::VARCHAR AND ct_resource.name = %(name_1)s::VARCHAR FOR UPDATE;
SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) AS now, ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at 
FROM ct_resource LEFT OUTER JOIN ct_request ON ct_request.namespace = ct_resource.namespace AND ct_request.resource = ct_resource.name 
WHERE ct_resource.namespace = %(namespace_1)s::VARCHAR AND ct_resource.name IN (%(name_1_1)s::VARCHAR) ORDER BY ct_request.id;
UPDATE ct_resource SET last_token=%(last_token)s::BIGINT WHERE ct_resource.namespace = %(namespace_1)s::VARCHAR AND ct_resource.name = %(name_1)s::VARCHAR;
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, token, lease_seconds, enqueued_at, granted_at, expires_at) VALUES (%(namespace)s::VARCHAR, %(resource)s::VARCHAR, %(holder)s::VARCHAR, %(request_key)s::VARCHAR, %(slots)s::INTEGER, %(mode)s::VARCHAR, %(state)s::VARCHAR, %(token)s::BIGINT, %(lease_seconds)s, %(enqueued_at)s, %(granted_at)s, %(expires_at)s) RETURNING ct_request.id;

-- ===== try_acquire while held: enqueue or refresh a waiter =====
SELECT ct_resource.name, ct_resource.capacity, ct_resource.last_token 
FROM ct_resource 
WHERE ct_resource.namespace = %(namespace_1)s::VARCHAR AND ct_resource.name = %(name_1)s::VARCHAR FOR UPDATE;
SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) AS now, ct_request.id, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.expires_at, ct_request.granted_at 
FROM ct_resource LEFT OUTER JOIN ct_request ON ct_request.namespace = ct_resource.namespace AND ct_request.resource = ct_resource.name 
WHERE ct_resource.namespace = %(namespace_1)s::VARCHAR AND ct_resource.name IN (%(name_1_1)s::VARCHAR) ORDER BY ct_request.id;
INSERT INTO ct_request (namespace, resource, holder, request_key, slots, mode, state, lease_seconds, enqueued_at, expires_at) VALUES (%(namespace)s::VARCHAR, %(resource)s::VARCHAR, %(holder)s::VARCHAR, %(request_key)s::VARCHAR, %(slots)s::INTEGER, %(mode)s::VARCHAR, %(state)s::VARCHAR, %(lease_seconds)s, %(enqueued_at)s, %(expires_at)s) RETURNING ct_request.id;

-- ===== renew a lease (fenced by the request key) =====
SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) AS db_now_1;
UPDATE ct_request SET lease_seconds=%(lease_seconds)s, expires_at=%(expires_at)s WHERE ct_request.request_key = %(request_key_1)s::VARCHAR AND ct_request.state = 'granted' AND ct_request.expires_at >= %(expires_at_1)s;

-- ===== release a lease =====
DELETE FROM ct_request WHERE ct_request.request_key = %(request_key_1)s::VARCHAR;

-- ===== status =====
SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) AS db_now_1;
SELECT ct_resource.namespace, ct_resource.name, ct_resource.capacity, ct_resource.last_token, ct_resource.created_at 
FROM ct_resource 
WHERE ct_resource.namespace = %(namespace_1)s::VARCHAR ORDER BY ct_resource.name;
SELECT ct_request.id, ct_request.namespace, ct_request.resource, ct_request.holder, ct_request.request_key, ct_request.slots, ct_request.mode, ct_request.state, ct_request.token, ct_request.lease_seconds, ct_request.enqueued_at, ct_request.granted_at, ct_request.expires_at 
FROM ct_request 
WHERE ct_request.namespace = %(namespace_1)s::VARCHAR ORDER BY ct_request.id;

-- ===== reap expired holders and waiters =====
DELETE FROM ct_request WHERE ct_request.namespace = %(namespace_1)s::VARCHAR AND ct_request.expires_at < CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION);

-- ===== events prepare (introspection) =====

-- ===== events prepare: claim columns, claim indexes, statistics (DDL) =====
-- each statement runs in a transaction of its own, after a lock timeout for DDL
-- (Oracle DDL_LOCK_TIMEOUT, PostgreSQL lock_timeout, MySQL lock_wait_timeout, SQL Server LOCK_TIMEOUT);
-- indexes are built online where the server offers it (PostgreSQL CONCURRENTLY, SQL Server and
-- Oracle Enterprise Edition: WITH (ONLINE = ON) / ONLINE appended to CREATE INDEX).
ALTER TABLE events ADD ct_state SMALLINT DEFAULT '0' NOT NULL;
ALTER TABLE events ADD ct_owner VARCHAR(200);
ALTER TABLE events ADD ct_token BIGINT;
ALTER TABLE events ADD ct_expires_at FLOAT(53);
ALTER TABLE events ADD ct_available_at FLOAT(53);
ALTER TABLE events ADD ct_attempts INTEGER DEFAULT '0' NOT NULL;
ALTER TABLE events ADD ct_error VARCHAR(2000);
ALTER TABLE events ADD ct_done_at FLOAT(53);
CREATE INDEX ct_pending_events ON events (event_id) WHERE ct_state = 0;
CREATE INDEX ct_claimed_events ON events (event_id) WHERE ct_state = 1;
ANALYZE events;

-- ===== events claim: one short transaction that skips rows other workers hold =====
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) ORDER BY events.event_id 
 LIMIT %(param_2)s::INTEGER FOR UPDATE SKIP LOCKED;
UPDATE events SET ct_state=%(ct_state)s::SMALLINT, ct_owner=%(ct_owner)s::VARCHAR, ct_token=%(ct_token)s::BIGINT, ct_expires_at=(CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) + %(param_1)s), ct_attempts=(events.ct_attempts + %(ct_attempts_1)s::INTEGER) WHERE events.event_id IN (SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)) ORDER BY events.event_id 
 LIMIT %(param_3)s::INTEGER FOR UPDATE SKIP LOCKED) RETURNING events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at;

-- ===== batch complete (fenced on the batch token) =====
UPDATE events SET ct_state=%(ct_state)s::SMALLINT, ct_expires_at=%(ct_expires_at)s, ct_error=%(ct_error)s::VARCHAR, ct_done_at=CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) WHERE events.ct_token = %(ct_token_1)s::BIGINT AND events.ct_state = 1;

-- ===== batch fail (back-off or error state, decided from the stored attempts) =====
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) ORDER BY events.event_id 
 LIMIT %(param_2)s::INTEGER FOR UPDATE SKIP LOCKED;
UPDATE events SET ct_state=%(ct_state)s::SMALLINT, ct_owner=%(ct_owner)s::VARCHAR, ct_token=%(ct_token)s::BIGINT, ct_expires_at=(CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) + %(param_1)s), ct_attempts=(events.ct_attempts + %(ct_attempts_1)s::INTEGER) WHERE events.event_id IN (SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)) ORDER BY events.event_id 
 LIMIT %(param_3)s::INTEGER FOR UPDATE SKIP LOCKED) RETURNING events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at;
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (%(event_id_1_1)s::INTEGER, %(event_id_1_2)s::INTEGER, %(event_id_1_3)s::INTEGER, %(event_id_1_4)s::INTEGER, %(event_id_1_5)s::INTEGER) AND events.ct_token = %(ct_token_1)s::BIGINT AND events.ct_state = 1 FOR UPDATE;
UPDATE events SET ct_state=CASE WHEN (events.ct_attempts >= %(ct_attempts_1)s::INTEGER) THEN %(param_1)s::INTEGER ELSE %(param_2)s::INTEGER END, ct_owner=%(ct_owner)s::VARCHAR, ct_token=%(ct_token)s::BIGINT, ct_expires_at=%(ct_expires_at)s, ct_available_at=CASE WHEN (events.ct_attempts >= %(ct_attempts_1)s::INTEGER) THEN NULL WHEN (events.ct_attempts <= %(ct_attempts_2)s::INTEGER) THEN CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) + %(param_3)s WHEN (events.ct_attempts <= %(ct_attempts_3)s::INTEGER) THEN CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) + %(param_4)s WHEN (events.ct_attempts <= %(ct_attempts_4)s::INTEGER) THEN CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) + %(param_5)s WHEN (events.ct_attempts <= %(ct_attempts_5)s::INTEGER) THEN CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) + %(param_6)s ELSE CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) + %(param_7)s END, ct_error=%(ct_error)s::VARCHAR WHERE events.event_id IN (%(event_id_1_1)s::INTEGER, %(event_id_1_2)s::INTEGER, %(event_id_1_3)s::INTEGER, %(event_id_1_4)s::INTEGER, %(event_id_1_5)s::INTEGER) AND events.ct_token = %(ct_token_1)s::BIGINT AND events.ct_state = 1;

-- ===== batch renew and release =====
SELECT events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) ORDER BY events.event_id 
 LIMIT %(param_2)s::INTEGER FOR UPDATE SKIP LOCKED;
UPDATE events SET ct_state=%(ct_state)s::SMALLINT, ct_owner=%(ct_owner)s::VARCHAR, ct_token=%(ct_token)s::BIGINT, ct_expires_at=(CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) + %(param_1)s), ct_attempts=(events.ct_attempts + %(ct_attempts_1)s::INTEGER) WHERE events.event_id IN (SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 AND (events.ct_available_at IS NULL OR events.ct_available_at <= CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)) ORDER BY events.event_id 
 LIMIT %(param_3)s::INTEGER FOR UPDATE SKIP LOCKED) RETURNING events.event_id, events.payload, events.ct_state, events.ct_owner, events.ct_token, events.ct_expires_at, events.ct_available_at, events.ct_attempts, events.ct_error, events.ct_done_at;
SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) AS db_now_1;
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (%(event_id_1_1)s::INTEGER, %(event_id_1_2)s::INTEGER) AND events.ct_token = %(ct_token_1)s::BIGINT AND events.ct_state = 1 AND events.ct_expires_at >= %(ct_expires_at_1)s FOR UPDATE;
UPDATE events SET ct_expires_at=%(ct_expires_at)s WHERE events.event_id IN (%(event_id_1_1)s::INTEGER, %(event_id_1_2)s::INTEGER) AND events.ct_token = %(ct_token_1)s::BIGINT AND events.ct_state = 1;
SELECT events.event_id 
FROM events 
WHERE events.event_id IN (%(event_id_1_1)s::INTEGER, %(event_id_1_2)s::INTEGER) AND events.ct_token = %(ct_token_1)s::BIGINT AND events.ct_state = 1 FOR UPDATE;
UPDATE events SET ct_state=%(ct_state)s::SMALLINT, ct_owner=%(ct_owner)s::VARCHAR, ct_token=%(ct_token)s::BIGINT, ct_expires_at=%(ct_expires_at)s, ct_attempts=CASE WHEN (events.ct_attempts > %(ct_attempts_1)s::INTEGER) THEN events.ct_attempts - %(ct_attempts_2)s::INTEGER ELSE %(param_1)s::INTEGER END WHERE events.event_id IN (%(event_id_1_1)s::INTEGER, %(event_id_1_2)s::INTEGER) AND events.ct_token = %(ct_token_1)s::BIGINT AND events.ct_state = 1;

-- ===== events stats =====
SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) AS db_now_1;
SELECT events.ct_state, count(*) AS count_1 
FROM events GROUP BY events.ct_state;
SELECT count(*) AS count_1 
FROM events 
WHERE events.ct_state = 1 AND events.ct_expires_at < %(ct_expires_at_1)s;
SELECT events.event_id 
FROM events 
WHERE events.ct_state = 0 ORDER BY events.event_id 
 LIMIT %(param_2)s::INTEGER;

-- ===== events retry_errors =====
UPDATE events SET ct_state=%(ct_state)s::SMALLINT, ct_available_at=%(ct_available_at)s, ct_attempts=%(ct_attempts)s::INTEGER, ct_error=%(ct_error)s::VARCHAR WHERE events.ct_state = 3;

-- ===== worklist populate =====
SELECT ct_worklist.last_token 
FROM ct_worklist 
WHERE ct_worklist.namespace = %(namespace_1)s::VARCHAR AND ct_worklist.name = %(name_1)s::VARCHAR FOR UPDATE;
INSERT INTO ct_worklist (namespace, name, last_token, created_at) VALUES (%(namespace)s::VARCHAR, %(name)s::VARCHAR, %(last_token)s::BIGINT, CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION));
SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) AS db_now_1;
INSERT INTO ct_work_item (namespace, worklist, exec_order, priority, payload, state, attempts, created_at) VALUES (%(namespace)s::VARCHAR, %(worklist)s::VARCHAR, %(exec_order)s::INTEGER, %(priority)s::INTEGER, %(payload)s::VARCHAR, %(state)s::VARCHAR, %(attempts)s::INTEGER, %(created_at)s) RETURNING ct_work_item.id;

-- ===== worklist allocate: lock the work list row, lowest unfinished order only =====
SELECT ct_worklist.last_token 
FROM ct_worklist 
WHERE ct_worklist.namespace = %(namespace_1)s::VARCHAR AND ct_worklist.name = %(name_1)s::VARCHAR FOR UPDATE;
SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) AS db_now_1;
SELECT min(ct_work_item.exec_order) AS min_1 
FROM ct_work_item 
WHERE ct_work_item.namespace = %(namespace_1)s::VARCHAR AND ct_work_item.worklist = %(worklist_1)s::VARCHAR AND ct_work_item.state IN ('new', 'active', 'error');
SELECT ct_work_item.id, ct_work_item.payload, ct_work_item.exec_order, ct_work_item.priority, ct_work_item.attempts 
FROM ct_work_item 
WHERE ct_work_item.namespace = %(namespace_1)s::VARCHAR AND ct_work_item.worklist = %(worklist_1)s::VARCHAR AND ct_work_item.exec_order = %(exec_order_1)s::INTEGER AND (ct_work_item.state = 'new' OR ct_work_item.state = 'active' AND ct_work_item.expires_at < %(expires_at_1)s) ORDER BY ct_work_item.priority DESC, ct_work_item.id 
 LIMIT %(param_3)s::INTEGER;
UPDATE ct_worklist SET last_token=%(last_token)s::BIGINT WHERE ct_worklist.namespace = %(namespace_1)s::VARCHAR AND ct_worklist.name = %(name_1)s::VARCHAR;
UPDATE ct_work_item SET state=%(state)s::VARCHAR, owner=%(owner)s::VARCHAR, token=%(token)s::BIGINT, attempts=(ct_work_item.attempts + %(attempts_1)s::INTEGER), started_at=%(started_at)s, finished_at=%(finished_at)s, expires_at=%(expires_at)s WHERE ct_work_item.id = %(id_1)s::BIGINT;

-- ===== work item complete (fenced on the item token) =====
UPDATE ct_work_item SET state=%(state)s::VARCHAR, last_error=%(last_error)s::VARCHAR, finished_at=CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION), expires_at=%(expires_at)s WHERE ct_work_item.id = %(id_1)s::BIGINT AND ct_work_item.token = %(token_1)s::BIGINT AND ct_work_item.state = 'active';

-- ===== worklist status =====
SELECT CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION) AS db_now_1;
SELECT ct_work_item.exec_order, ct_work_item.state, count(*) AS count_1, sum(CASE WHEN (ct_work_item.state = 'active' AND ct_work_item.expires_at < %(expires_at_1)s) THEN %(param_2)s::INTEGER ELSE %(param_3)s::INTEGER END) AS sum_1 
FROM ct_work_item 
WHERE ct_work_item.namespace = %(namespace_1)s::VARCHAR AND ct_work_item.worklist = %(worklist_1)s::VARCHAR GROUP BY ct_work_item.exec_order, ct_work_item.state ORDER BY ct_work_item.exec_order;
