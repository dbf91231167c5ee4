--
-- PostgreSQL database dump
--

\restrict oZWdu065ABihboagPahPQVduE8jO6jjDylvDftkn5cpjclgiWDcXtIKaSqQJW2d

-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: cp_fixture; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA cp_fixture;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: artifact_manifests; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.artifact_manifests (
    tenant text NOT NULL COLLATE pg_catalog."C",
    session text NOT NULL COLLATE pg_catalog."C",
    name text NOT NULL COLLATE pg_catalog."C",
    size bigint NOT NULL,
    sha256 text NOT NULL,
    written_at text NOT NULL,
    key_id text NOT NULL,
    signature text NOT NULL,
    CONSTRAINT artifact_manifests_size_check CHECK ((size >= 0))
);


--
-- Name: calibration; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.calibration (
    tenant text NOT NULL COLLATE pg_catalog."C",
    model text NOT NULL COLLATE pg_catalog."C",
    ratio double precision NOT NULL,
    updated_at text NOT NULL,
    CONSTRAINT calibration_ratio_check CHECK ((ratio > (0)::double precision))
);


--
-- Name: durable_changes; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.durable_changes (
    tenant text NOT NULL COLLATE pg_catalog."C",
    session text NOT NULL COLLATE pg_catalog."C",
    seq bigint NOT NULL,
    kind text NOT NULL COLLATE pg_catalog."C",
    item_id text NOT NULL COLLATE pg_catalog."C",
    version bigint NOT NULL,
    op text NOT NULL,
    body text NOT NULL,
    recorded_at text NOT NULL,
    CONSTRAINT durable_changes_kind_check CHECK ((kind = ANY (ARRAY['fact'::text, 'pending'::text, 'evidence'::text]))),
    CONSTRAINT durable_changes_op_check CHECK ((op = ANY (ARRAY['create'::text, 'update'::text, 'retire'::text]))),
    CONSTRAINT durable_changes_seq_check CHECK ((seq >= 1)),
    CONSTRAINT durable_changes_version_check CHECK ((version >= 1))
);


--
-- Name: gc_leases; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.gc_leases (
    name text NOT NULL COLLATE pg_catalog."C",
    holder text NOT NULL,
    expires_at double precision NOT NULL
);


--
-- Name: manifests; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.manifests (
    tenant text NOT NULL COLLATE pg_catalog."C",
    compaction_id text NOT NULL COLLATE pg_catalog."C",
    session text NOT NULL COLLATE pg_catalog."C",
    manifest text NOT NULL,
    stored_at text NOT NULL
);


--
-- Name: plans; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.plans (
    tenant text NOT NULL COLLATE pg_catalog."C",
    prefix_hash text NOT NULL COLLATE pg_catalog."C",
    anchor text NOT NULL COLLATE pg_catalog."C",
    prefix_len bigint NOT NULL,
    plan_json text NOT NULL,
    created_at text NOT NULL,
    CONSTRAINT plans_prefix_len_check CHECK ((prefix_len >= 1))
);


--
-- Name: quota_counters; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.quota_counters (
    tenant text NOT NULL COLLATE pg_catalog."C",
    scope text NOT NULL COLLATE pg_catalog."C",
    metric text NOT NULL COLLATE pg_catalog."C",
    window_start_ms bigint NOT NULL,
    window_end_ms bigint NOT NULL,
    value bigint NOT NULL
);


--
-- Name: schema_migrations; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at text NOT NULL
);


--
-- Name: session_agents; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.session_agents (
    tenant text NOT NULL COLLATE pg_catalog."C",
    session text NOT NULL COLLATE pg_catalog."C",
    agent text NOT NULL COLLATE pg_catalog."C",
    parent text DEFAULT ''::text NOT NULL COLLATE pg_catalog."C",
    first_seen text NOT NULL,
    last_seen text NOT NULL
);


--
-- Name: sessions; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.sessions (
    tenant text NOT NULL COLLATE pg_catalog."C",
    session text NOT NULL COLLATE pg_catalog."C",
    created_at text NOT NULL,
    updated_at text NOT NULL
);


--
-- Name: source_audit; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.source_audit (
    id bigint NOT NULL,
    tenant text NOT NULL COLLATE pg_catalog."C",
    session text NOT NULL COLLATE pg_catalog."C",
    pointer text NOT NULL COLLATE pg_catalog."C",
    status text NOT NULL,
    digest text,
    backend text NOT NULL,
    detail text NOT NULL,
    duration_ms double precision NOT NULL,
    asked_by text NOT NULL,
    checked_at text NOT NULL COLLATE pg_catalog."C",
    CONSTRAINT source_audit_status_check CHECK ((status = ANY (ARRAY['available'::text, 'missing'::text, 'denied'::text, 'corrupt'::text, 'unsupported'::text])))
);


--
-- Name: source_audit_id_seq; Type: SEQUENCE; Schema: cp_fixture; Owner: -
--

ALTER TABLE cp_fixture.source_audit ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME cp_fixture.source_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: summaries; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.summaries (
    tenant text NOT NULL COLLATE pg_catalog."C",
    summary_key text NOT NULL COLLATE pg_catalog."C",
    state text NOT NULL,
    holder text NOT NULL,
    expires_at double precision NOT NULL,
    summary text,
    updated_at text NOT NULL,
    CONSTRAINT summaries_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'ok'::text, 'failed'::text])))
);


--
-- Name: transcript_events; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.transcript_events (
    tenant text NOT NULL COLLATE pg_catalog."C",
    session text NOT NULL COLLATE pg_catalog."C",
    seq bigint NOT NULL,
    event_id text NOT NULL COLLATE pg_catalog."C",
    recorded_at text NOT NULL,
    type text NOT NULL,
    role text NOT NULL,
    content text NOT NULL,
    complete boolean NOT NULL,
    prefix_count bigint NOT NULL,
    prefix_hash text NOT NULL,
    event_key text COLLATE pg_catalog."C",
    agent text DEFAULT ''::text NOT NULL COLLATE pg_catalog."C",
    CONSTRAINT transcript_events_seq_check CHECK ((seq >= 1)),
    CONSTRAINT transcript_events_type_check CHECK ((type = ANY (ARRAY['message'::text, 'answer'::text])))
);


--
-- Name: transcript_heads; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.transcript_heads (
    tenant text NOT NULL COLLATE pg_catalog."C",
    session text NOT NULL COLLATE pg_catalog."C",
    last_seq bigint NOT NULL,
    prefix_count bigint NOT NULL,
    prefix_hash text NOT NULL,
    agent text DEFAULT ''::text NOT NULL COLLATE pg_catalog."C",
    CONSTRAINT transcript_heads_last_seq_check CHECK ((last_seq >= 0)),
    CONSTRAINT transcript_heads_prefix_count_check CHECK ((prefix_count >= 0))
);


--
-- Name: usage_ledger; Type: TABLE; Schema: cp_fixture; Owner: -
--

CREATE TABLE cp_fixture.usage_ledger (
    id bigint NOT NULL,
    tenant text NOT NULL COLLATE pg_catalog."C",
    at text NOT NULL,
    at_ms bigint NOT NULL,
    session text COLLATE pg_catalog."C",
    model text NOT NULL COLLATE pg_catalog."C",
    route text NOT NULL,
    kind text NOT NULL,
    status integer NOT NULL,
    latency_ms double precision NOT NULL,
    request_id text,
    tokens_before bigint,
    tokens_after bigint,
    layers text,
    plan text,
    summary text,
    compaction_id text,
    input_tokens bigint,
    cache_creation_input_tokens bigint,
    cache_creation_5m bigint,
    cache_creation_1h bigint,
    cache_read_input_tokens bigint,
    output_tokens bigint,
    usage_json text,
    provider_compactions bigint,
    provider_compaction_input_tokens bigint,
    provider_compaction_cache_creation_input_tokens bigint,
    provider_compaction_cache_creation_5m bigint,
    provider_compaction_cache_creation_1h bigint,
    provider_compaction_cache_read_input_tokens bigint,
    provider_compaction_output_tokens bigint,
    provider_notes text,
    thinking_blocks_dropped bigint,
    agent text COLLATE pg_catalog."C",
    CONSTRAINT usage_ledger_kind_check CHECK ((kind = ANY (ARRAY['client'::text, 'summary'::text, 'retrieval'::text])))
);


--
-- Name: usage_ledger_id_seq; Type: SEQUENCE; Schema: cp_fixture; Owner: -
--

ALTER TABLE cp_fixture.usage_ledger ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME cp_fixture.usage_ledger_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Data for Name: artifact_manifests; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.artifact_manifests VALUES ('acme', 's1', 'a.txt', 5, 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', '2026-01-01T00:00:00.000000+00:00', 'k1', '8e66e11448264ca0314086dafc6c558986bf478a650242ec08b6a1a3b5b2ea96');
INSERT INTO cp_fixture.artifact_manifests VALUES ('acme', 's1', 'b.txt', 5, 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', '2026-01-01T00:00:00.000000+00:00', 'k1', '8e62fa8ad1e4ee120e78430a93812e443ecd561bcd31f5ee79a4ddd5606fe067');


--
-- Data for Name: calibration; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.calibration VALUES ('acme', 'claude-sonnet-4-5', 1.25, '2026-12-06T03:06:52.665505+00:00');
INSERT INTO cp_fixture.calibration VALUES ('acme', 'claude-opus-4-1', 1.375, '2026-12-06T03:06:52.666371+00:00');


--
-- Data for Name: durable_changes; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.durable_changes VALUES ('acme', 's1', 1, 'fact', 'f1', 1, 'create', '{"op":"create","kind":"fact","item":{"id":"f1","content":"acme: the store is SQLite","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:00:00Z"}}', '2026-12-06T03:06:52.611768+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('acme', 's1', 2, 'pending', 'p1', 1, 'create', '{"op":"create","kind":"pending","item":{"id":"p1","content":"write the upgrade page","status":"open","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:00:00Z"}}', '2026-12-06T03:06:52.611768+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('acme', 's1', 3, 'evidence', 'm1', 1, 'create', '{"op":"create","kind":"evidence","item":{"id":"m1","title":"a memory","source":"transcript:s1:1","captured_at":"2026-01-01T00:00:00Z","score":0.75,"rank":1,"last_confirmed_at":"2026-01-01T00:00:00Z","conflict_key":null}}', '2026-12-06T03:06:52.611768+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('acme', 's1', 4, 'fact', 'f1', 2, 'update', '{"op":"update","kind":"fact","item":{"id":"f1","content":"acme: the store is PostgreSQL","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:01:00Z"}}', '2026-12-06T03:06:52.614754+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('acme', 's1', 5, 'pending', 'p1', 2, 'update', '{"op":"update","kind":"pending","item":{"id":"p1","content":"write the upgrade page","status":"done","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:02:00Z"}}', '2026-12-06T03:06:52.614754+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('acme', 's1', 6, 'fact', 'f2', 1, 'create', '{"op":"create","kind":"fact","item":{"id":"f2","content":"retired soon","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:02:00Z"}}', '2026-12-06T03:06:52.614754+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('acme', 's1', 7, 'fact', 'f2', 2, 'retire', '{"op":"retire","kind":"fact","id":"f2","source":"transcript:s1:1","retired_at":"2026-01-01T00:03:00Z"}', '2026-12-06T03:06:52.616096+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('globex', 's1', 1, 'fact', 'f1', 1, 'create', '{"op":"create","kind":"fact","item":{"id":"f1","content":"globex: the store is SQLite","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:00:00Z"}}', '2026-12-06T03:06:52.617132+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('globex', 's1', 2, 'pending', 'p1', 1, 'create', '{"op":"create","kind":"pending","item":{"id":"p1","content":"write the upgrade page","status":"open","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:00:00Z"}}', '2026-12-06T03:06:52.617132+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('globex', 's1', 3, 'evidence', 'm1', 1, 'create', '{"op":"create","kind":"evidence","item":{"id":"m1","title":"a memory","source":"transcript:s1:1","captured_at":"2026-01-01T00:00:00Z","score":0.75,"rank":1,"last_confirmed_at":"2026-01-01T00:00:00Z","conflict_key":null}}', '2026-12-06T03:06:52.617132+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('globex', 's1', 4, 'fact', 'f1', 2, 'update', '{"op":"update","kind":"fact","item":{"id":"f1","content":"globex: the store is PostgreSQL","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:01:00Z"}}', '2026-12-06T03:06:52.618299+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('globex', 's1', 5, 'pending', 'p1', 2, 'update', '{"op":"update","kind":"pending","item":{"id":"p1","content":"write the upgrade page","status":"done","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:02:00Z"}}', '2026-12-06T03:06:52.618299+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('globex', 's1', 6, 'fact', 'f2', 1, 'create', '{"op":"create","kind":"fact","item":{"id":"f2","content":"retired soon","source":"transcript:s1:1","last_confirmed_at":"2026-01-01T00:02:00Z"}}', '2026-12-06T03:06:52.618299+00:00');
INSERT INTO cp_fixture.durable_changes VALUES ('globex', 's1', 7, 'fact', 'f2', 2, 'retire', '{"op":"retire","kind":"fact","id":"f2","source":"transcript:s1:1","retired_at":"2026-01-01T00:03:00Z"}', '2026-12-06T03:06:52.619465+00:00');


--
-- Data for Name: gc_leases; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.gc_leases VALUES ('retention', 'replica-1', 1767225660);


--
-- Data for Name: manifests; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.manifests VALUES ('acme', 'cmp-1', 's1', '{"compaction_id": "cmp-1", "records": [0]}', '2026-12-06T03:06:52.654119+00:00');
INSERT INTO cp_fixture.manifests VALUES ('acme', 'cmp-2', 's1', '{"compaction_id": "cmp-2", "records": [1]}', '2026-12-06T03:06:52.655359+00:00');


--
-- Data for Name: plans; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.plans VALUES ('acme', 'anchor-1-p4', 'anchor-1', 4, '{"plan": 0, "len": 4}', '2026-12-06T03:06:52.655969+00:00');
INSERT INTO cp_fixture.plans VALUES ('acme', 'anchor-1-p8', 'anchor-1', 8, '{"plan": 0, "len": 8}', '2026-12-06T03:06:52.657447+00:00');
INSERT INTO cp_fixture.plans VALUES ('acme', 'anchor-2-p4', 'anchor-2', 4, '{"plan": 1, "len": 4}', '2026-12-06T03:06:52.658127+00:00');
INSERT INTO cp_fixture.plans VALUES ('acme', 'anchor-2-p8', 'anchor-2', 8, '{"plan": 1, "len": 8}', '2026-12-06T03:06:52.659020+00:00');


--
-- Data for Name: quota_counters; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.quota_counters VALUES ('acme', 'tenant', 'input_tokens', 1767225600000, 1767225660000, 1234);
INSERT INTO cp_fixture.quota_counters VALUES ('acme', 'key:abababababababab', 'requests', 1767225600000, 1767225660000, 1);
INSERT INTO cp_fixture.quota_counters VALUES ('acme', 'tenant', 'requests', 1767225600000, 1767225660000, 6);


--
-- Data for Name: schema_migrations; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.schema_migrations VALUES (1, 'sessions, durable history, transcripts, manifests', '2026-12-06T03:06:52.587145+00:00');
INSERT INTO cp_fixture.schema_migrations VALUES (2, 'compaction plans', '2026-12-06T03:06:52.589313+00:00');
INSERT INTO cp_fixture.schema_migrations VALUES (3, 'summary leases and calibration', '2026-12-06T03:06:52.591938+00:00');
INSERT INTO cp_fixture.schema_migrations VALUES (4, 'transcript event keys (exactly once)', '2026-12-06T03:06:52.592849+00:00');
INSERT INTO cp_fixture.schema_migrations VALUES (5, 'usage ledger', '2026-12-06T03:06:52.595840+00:00');
INSERT INTO cp_fixture.schema_migrations VALUES (6, 'signed artifact manifests and source audit', '2026-12-06T03:06:52.599168+00:00');
INSERT INTO cp_fixture.schema_migrations VALUES (7, 'garbage collector leases and time indexes', '2026-12-06T03:06:52.602008+00:00');
INSERT INTO cp_fixture.schema_migrations VALUES (8, 'conversations per agent: transcripts keyed by agent, session_agents', '2026-12-06T03:06:52.607361+00:00');
INSERT INTO cp_fixture.schema_migrations VALUES (9, 'usage ledger: provider compaction and notes, agent', '2026-12-06T03:06:52.608086+00:00');
INSERT INTO cp_fixture.schema_migrations VALUES (10, 'quota counters', '2026-12-06T03:06:52.609853+00:00');


--
-- Data for Name: session_agents; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.session_agents VALUES ('acme', 's1', 'agent-a', '', '2026-12-06T03:06:52.630200+00:00', '2026-12-06T03:06:52.636897+00:00');
INSERT INTO cp_fixture.session_agents VALUES ('acme', 's1', 'agent-b', 'agent-a', '2026-12-06T03:06:52.638080+00:00', '2026-12-06T03:06:52.644035+00:00');


--
-- Data for Name: sessions; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.sessions VALUES ('globex', 's1', '2026-12-06T03:06:52.617132+00:00', '2026-12-06T03:06:52.650335+00:00');
INSERT INTO cp_fixture.sessions VALUES ('acme', 's2', '2026-12-06T03:06:52.651339+00:00', '2026-12-06T03:06:52.652888+00:00');
INSERT INTO cp_fixture.sessions VALUES ('acme', 's1', '2026-12-06T03:06:52.611768+00:00', '2026-12-06T03:06:52.655359+00:00');


--
-- Data for Name: source_audit; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.source_audit OVERRIDING SYSTEM VALUE VALUES (1, 'acme', 's1', 'artifact:s1:a.txt:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', 'available', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', 'local', '', 1.5, 'request:chk_0', '2026-01-01T00:00:00.000000+00:00');
INSERT INTO cp_fixture.source_audit OVERRIDING SYSTEM VALUE VALUES (2, 'acme', 's1', 'artifact:s1:b.txt:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', 'corrupt', NULL, 'local', 'signature', 1.5, 'request:chk_1', '2026-01-01T00:00:01.000000+00:00');
INSERT INTO cp_fixture.source_audit OVERRIDING SYSTEM VALUE VALUES (3, 'acme', 's1', 'artifact:s1:c.txt:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', 'missing', NULL, 'local', '', 1.5, 'request:chk_2', '2026-01-01T00:00:02.000000+00:00');


--
-- Data for Name: summaries; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.summaries VALUES ('acme', 'sum-ok', 'ok', 'replica-1', 1796526412.662074, 'the summary text', '2026-12-06T03:06:52.662162+00:00');
INSERT INTO cp_fixture.summaries VALUES ('acme', 'sum-failed', 'failed', 'replica-1', 2111886412.664008, NULL, '2026-12-06T03:06:52.664098+00:00');
INSERT INTO cp_fixture.summaries VALUES ('acme', 'sum-held', 'pending', 'replica-2', 2111886412.66488, NULL, '2026-12-06T03:06:52.664964+00:00');


--
-- Data for Name: transcript_events; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 1, 'evt-1', '2026-01-01T00:00:01+00:00', 'message', 'user', '[{"type":"text","text":"acme/ q0"}]', true, 1, 'h1', 'm0:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 2, 'evt-2', '2026-01-01T00:00:02+00:00', 'answer', 'assistant', '[{"type":"text","text":"a0"}]', true, 2, 'h2', 'a1:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 3, 'evt-3', '2026-01-01T00:00:03+00:00', 'message', 'user', '[{"type":"text","text":"acme/ q1"}]', false, 3, 'h3', 'm2:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 4, 'evt-4', '2026-01-01T00:00:04+00:00', 'answer', 'assistant', '[{"type":"text","text":"a1"}]', true, 4, 'h4', 'a3:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 5, 'evt-5', '2026-01-01T00:00:05+00:00', 'message', 'user', '[{"type":"text","text":"acme/ q2"}]', true, 5, 'h5', 'm4:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 6, 'evt-6', '2026-01-01T00:00:06+00:00', 'answer', 'assistant', '[{"type":"text","text":"a2"}]', true, 6, 'h6', 'a5:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 1, 'evt-7', '2026-01-01T00:00:07+00:00', 'message', 'user', '[{"type":"text","text":"acme/agent-a q0"}]', true, 1, 'h1', 'm0:agent-a', 'agent-a');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 2, 'evt-8', '2026-01-01T00:00:08+00:00', 'answer', 'assistant', '[{"type":"text","text":"a0"}]', true, 2, 'h2', 'a1:agent-a', 'agent-a');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 3, 'evt-9', '2026-01-01T00:00:09+00:00', 'message', 'user', '[{"type":"text","text":"acme/agent-a q1"}]', true, 3, 'h3', 'm2:agent-a', 'agent-a');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 4, 'evt-10', '2026-01-01T00:00:10+00:00', 'answer', 'assistant', '[{"type":"text","text":"a1"}]', false, 4, 'h4', 'a3:agent-a', 'agent-a');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 5, 'evt-11', '2026-01-01T00:00:11+00:00', 'message', 'user', '[{"type":"text","text":"acme/agent-a q2"}]', true, 5, 'h5', 'm4:agent-a', 'agent-a');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 6, 'evt-12', '2026-01-01T00:00:12+00:00', 'answer', 'assistant', '[{"type":"text","text":"a2"}]', true, 6, 'h6', 'a5:agent-a', 'agent-a');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 1, 'evt-13', '2026-01-01T00:00:13+00:00', 'message', 'user', '[{"type":"text","text":"acme/agent-b q0"}]', true, 1, 'h1', 'm0:agent-b', 'agent-b');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 2, 'evt-14', '2026-01-01T00:00:14+00:00', 'answer', 'assistant', '[{"type":"text","text":"a0"}]', true, 2, 'h2', 'a1:agent-b', 'agent-b');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 3, 'evt-15', '2026-01-01T00:00:15+00:00', 'message', 'user', '[{"type":"text","text":"acme/agent-b q1"}]', true, 3, 'h3', 'm2:agent-b', 'agent-b');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 4, 'evt-16', '2026-01-01T00:00:16+00:00', 'answer', 'assistant', '[{"type":"text","text":"a1"}]', true, 4, 'h4', 'a3:agent-b', 'agent-b');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 5, 'evt-17', '2026-01-01T00:00:17+00:00', 'message', 'user', '[{"type":"text","text":"acme/agent-b q2"}]', false, 5, 'h5', 'm4:agent-b', 'agent-b');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's1', 6, 'evt-18', '2026-01-01T00:00:18+00:00', 'answer', 'assistant', '[{"type":"text","text":"a2"}]', true, 6, 'h6', 'a5:agent-b', 'agent-b');
INSERT INTO cp_fixture.transcript_events VALUES ('globex', 's1', 1, 'evt-19', '2026-01-01T00:00:19+00:00', 'message', 'user', '[{"type":"text","text":"globex/ q0"}]', true, 1, 'h1', 'm0:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('globex', 's1', 2, 'evt-20', '2026-01-01T00:00:20+00:00', 'answer', 'assistant', '[{"type":"text","text":"a0"}]', true, 2, 'h2', 'a1:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('globex', 's1', 3, 'evt-21', '2026-01-01T00:00:21+00:00', 'message', 'user', '[{"type":"text","text":"globex/ q1"}]', true, 3, 'h3', 'm2:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('globex', 's1', 4, 'evt-22', '2026-01-01T00:00:22+00:00', 'answer', 'assistant', '[{"type":"text","text":"a1"}]', true, 4, 'h4', 'a3:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('globex', 's1', 5, 'evt-23', '2026-01-01T00:00:23+00:00', 'message', 'user', '[{"type":"text","text":"globex/ q2"}]', true, 5, 'h5', 'm4:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('globex', 's1', 6, 'evt-24', '2026-01-01T00:00:24+00:00', 'answer', 'assistant', '[{"type":"text","text":"a2"}]', false, 6, 'h6', 'a5:', '');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's2', 1, 'evt-900', '2026-01-01T00:15:00+00:00', 'message', 'user', '[{"type":"text","text":"old 1"}]', true, 1, 'o1', NULL, '');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's2', 2, 'evt-901', '2026-01-01T00:15:01+00:00', 'answer', 'assistant', '[{"type":"text","text":"old 2"}]', true, 3, 'o3', NULL, '');
INSERT INTO cp_fixture.transcript_events VALUES ('acme', 's2', 3, 'evt-902', '2026-01-01T00:15:02+00:00', 'message', 'user', '[{"type":"text","text":"old 3"}]', true, 3, 'o3', NULL, '');


--
-- Data for Name: transcript_heads; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.transcript_heads VALUES ('acme', 's1', 6, 6, 'h6', '');
INSERT INTO cp_fixture.transcript_heads VALUES ('acme', 's1', 6, 6, 'h6', 'agent-a');
INSERT INTO cp_fixture.transcript_heads VALUES ('acme', 's1', 6, 6, 'h6', 'agent-b');
INSERT INTO cp_fixture.transcript_heads VALUES ('globex', 's1', 6, 6, 'h6', '');
INSERT INTO cp_fixture.transcript_heads VALUES ('acme', 's2', 3, 3, 'o3', '');


--
-- Data for Name: usage_ledger; Type: TABLE DATA; Schema: cp_fixture; Owner: -
--

INSERT INTO cp_fixture.usage_ledger OVERRIDING SYSTEM VALUE VALUES (1, 'acme', '2026-01-01T00:00:00.000+00:00', 1767225600000, 's1', 'claude-sonnet-4-5', 'messages', 'client', 200, 10.5, 'req_0', 2000, 1000, 'prune,summarize', 'reused', 'ok', 'cmp-0', 12, 100, 60, 40, 1000, 5, '{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"cache_creation":{"ephemeral_5m_input_tokens":60,"ephemeral_1h_input_tokens":40},"output_tokens":5,"service_tier":"standard"}', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL);
INSERT INTO cp_fixture.usage_ledger OVERRIDING SYSTEM VALUE VALUES (2, 'globex', '2026-01-01T00:01:01.000+00:00', 1767225661000, 's1', 'claude-opus-4-1', 'messages', 'summary', 200, 11.5, 'req_1', 2001, 1000, 'prune,summarize', 'new', 'ok', 'cmp-1', 12, 100, 60, 40, 1000, 5, '{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"cache_creation":{"ephemeral_5m_input_tokens":60,"ephemeral_1h_input_tokens":40},"output_tokens":5,"service_tier":"standard"}', 1, 5, 0, NULL, NULL, 7, 3, NULL, 0, NULL);
INSERT INTO cp_fixture.usage_ledger OVERRIDING SYSTEM VALUE VALUES (3, 'acme', '2026-01-01T00:02:02.000+00:00', 1767225722000, 's1', 'claude-sonnet-4-5', 'messages', 'retrieval', 200, 12.5, 'req_2', 2002, 1000, 'prune,summarize', 'reused', 'ok', 'cmp-2', 12, 100, 60, 40, 1000, 5, '{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"cache_creation":{"ephemeral_5m_input_tokens":60,"ephemeral_1h_input_tokens":40},"output_tokens":5,"service_tier":"standard"}', 0, NULL, NULL, NULL, NULL, NULL, NULL, '{"applied_edits":[{"type":"clear"}]}', 2, NULL);
INSERT INTO cp_fixture.usage_ledger OVERRIDING SYSTEM VALUE VALUES (4, 'globex', '2026-01-01T00:03:03.000+00:00', 1767225783000, 's1', 'claude-opus-4-1', 'messages', 'client', 200, 13.5, 'req_3', 2003, 1000, 'prune,summarize', 'new', 'ok', 'cmp-3', 12, 100, 60, 40, 1000, 5, '{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"cache_creation":{"ephemeral_5m_input_tokens":60,"ephemeral_1h_input_tokens":40},"output_tokens":5,"service_tier":"standard"}', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 'agent-a');
INSERT INTO cp_fixture.usage_ledger OVERRIDING SYSTEM VALUE VALUES (5, 'acme', '2026-01-01T00:04:04.000+00:00', 1767225844000, 's1', 'claude-sonnet-4-5', 'messages', 'summary', 529, 14.5, 'req_4', 2004, 1000, 'prune,summarize', 'reused', 'ok', 'cmp-4', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL);
INSERT INTO cp_fixture.usage_ledger OVERRIDING SYSTEM VALUE VALUES (6, 'globex', '2026-01-01T00:05:05.000+00:00', 1767225905000, NULL, 'claude-opus-4-1', 'messages', 'retrieval', 200, 15.5, 'req_5', 2005, 1000, 'prune,summarize', 'new', 'ok', 'cmp-5', 12, 100, 60, 40, 1000, 5, '{"input_tokens":12,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"cache_creation":{"ephemeral_5m_input_tokens":60,"ephemeral_1h_input_tokens":40},"output_tokens":5,"service_tier":"standard"}', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL);


--
-- Name: source_audit_id_seq; Type: SEQUENCE SET; Schema: cp_fixture; Owner: -
--

SELECT pg_catalog.setval('cp_fixture.source_audit_id_seq', 3, true);


--
-- Name: usage_ledger_id_seq; Type: SEQUENCE SET; Schema: cp_fixture; Owner: -
--

SELECT pg_catalog.setval('cp_fixture.usage_ledger_id_seq', 6, true);


--
-- Name: artifact_manifests artifact_manifests_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.artifact_manifests
    ADD CONSTRAINT artifact_manifests_pkey PRIMARY KEY (tenant, session, name);


--
-- Name: calibration calibration_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.calibration
    ADD CONSTRAINT calibration_pkey PRIMARY KEY (tenant, model);


--
-- Name: durable_changes durable_changes_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.durable_changes
    ADD CONSTRAINT durable_changes_pkey PRIMARY KEY (tenant, session, seq);


--
-- Name: durable_changes durable_changes_tenant_session_kind_item_id_version_key; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.durable_changes
    ADD CONSTRAINT durable_changes_tenant_session_kind_item_id_version_key UNIQUE (tenant, session, kind, item_id, version);


--
-- Name: gc_leases gc_leases_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.gc_leases
    ADD CONSTRAINT gc_leases_pkey PRIMARY KEY (name);


--
-- Name: manifests manifests_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.manifests
    ADD CONSTRAINT manifests_pkey PRIMARY KEY (tenant, compaction_id);


--
-- Name: plans plans_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.plans
    ADD CONSTRAINT plans_pkey PRIMARY KEY (tenant, prefix_hash);


--
-- Name: quota_counters quota_counters_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.quota_counters
    ADD CONSTRAINT quota_counters_pkey PRIMARY KEY (tenant, scope, metric, window_start_ms);


--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: session_agents session_agents_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.session_agents
    ADD CONSTRAINT session_agents_pkey PRIMARY KEY (tenant, session, agent);


--
-- Name: sessions sessions_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.sessions
    ADD CONSTRAINT sessions_pkey PRIMARY KEY (tenant, session);


--
-- Name: source_audit source_audit_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.source_audit
    ADD CONSTRAINT source_audit_pkey PRIMARY KEY (id);


--
-- Name: summaries summaries_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.summaries
    ADD CONSTRAINT summaries_pkey PRIMARY KEY (tenant, summary_key);


--
-- Name: transcript_events transcript_events_event_id_key; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.transcript_events
    ADD CONSTRAINT transcript_events_event_id_key UNIQUE (tenant, session, agent, event_id);


--
-- Name: transcript_events transcript_events_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.transcript_events
    ADD CONSTRAINT transcript_events_pkey PRIMARY KEY (tenant, session, agent, seq);


--
-- Name: transcript_heads transcript_heads_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.transcript_heads
    ADD CONSTRAINT transcript_heads_pkey PRIMARY KEY (tenant, session, agent);


--
-- Name: usage_ledger usage_ledger_pkey; Type: CONSTRAINT; Schema: cp_fixture; Owner: -
--

ALTER TABLE ONLY cp_fixture.usage_ledger
    ADD CONSTRAINT usage_ledger_pkey PRIMARY KEY (id);


--
-- Name: manifests_by_session; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX manifests_by_session ON cp_fixture.manifests USING btree (tenant, session);


--
-- Name: manifests_by_time; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX manifests_by_time ON cp_fixture.manifests USING btree (tenant, stored_at);


--
-- Name: plans_by_anchor; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX plans_by_anchor ON cp_fixture.plans USING btree (tenant, anchor, prefix_len);


--
-- Name: plans_by_time; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX plans_by_time ON cp_fixture.plans USING btree (tenant, created_at);


--
-- Name: quota_counters_by_end; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX quota_counters_by_end ON cp_fixture.quota_counters USING btree (window_end_ms);


--
-- Name: source_audit_by_tenant; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX source_audit_by_tenant ON cp_fixture.source_audit USING btree (tenant, id);


--
-- Name: source_audit_by_time; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX source_audit_by_time ON cp_fixture.source_audit USING btree (checked_at);


--
-- Name: summaries_by_time; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX summaries_by_time ON cp_fixture.summaries USING btree (tenant, updated_at);


--
-- Name: transcript_events_by_key; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE UNIQUE INDEX transcript_events_by_key ON cp_fixture.transcript_events USING btree (tenant, session, agent, event_key);


--
-- Name: transcript_events_by_time; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX transcript_events_by_time ON cp_fixture.transcript_events USING btree (tenant, recorded_at);


--
-- Name: usage_ledger_age; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX usage_ledger_age ON cp_fixture.usage_ledger USING btree (at_ms);


--
-- Name: usage_ledger_by_session; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX usage_ledger_by_session ON cp_fixture.usage_ledger USING btree (tenant, session, at_ms);


--
-- Name: usage_ledger_by_time; Type: INDEX; Schema: cp_fixture; Owner: -
--

CREATE INDEX usage_ledger_by_time ON cp_fixture.usage_ledger USING btree (tenant, at_ms);


--
-- PostgreSQL database dump complete
--

\unrestrict oZWdu065ABihboagPahPQVduE8jO6jjDylvDftkn5cpjclgiWDcXtIKaSqQJW2d

