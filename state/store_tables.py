"""The state file's tables and indexes, created where missing (`store_migrations` brings older files up)."""

# dependency_index_key stays although it costs a bulk take-over: at 100,000 plans / 4M edges it answers a lookup of
# up to ~30 keys (an apply batch's) in 1-2 ms against 70-150 ms for a scan; inserting 4M edges with it costs ~1-3 s
# more (insert and commit), measured on two shared cores.
# recompile_queue's src_* columns name the event that queued a key in files written before 2026-12-07; nothing reads
# them (every worker publishes the successors of the plans it queued) and keys are queued without them since.
TABLES = """
CREATE TABLE IF NOT EXISTS resources (
  id VARCHAR PRIMARY KEY, version BIGINT NOT NULL, entity VARCHAR, evidence_class VARCHAR,
  tokens BIGINT, title VARCHAR, content VARCHAR, supports VARCHAR[], contradicts VARCHAR[],
  valid_from TIMESTAMPTZ, valid_to TIMESTAMPTZ, superseded_by VARCHAR, provenance_group VARCHAR,
  sensitivity VARCHAR, attributes VARCHAR, deleted BOOLEAN NOT NULL DEFAULT false);
CREATE INDEX IF NOT EXISTS resources_entity ON resources (entity);
CREATE TABLE IF NOT EXISTS principals (
  id VARCHAR PRIMARY KEY, roles VARCHAR[], attributes VARCHAR, delegation_version BIGINT,
  deleted BOOLEAN NOT NULL DEFAULT false, made_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS revoked (
  principal VARCHAR, kind VARCHAR, value VARCHAR, effective_at TIMESTAMPTZ, issued_by VARCHAR,
  event_id VARCHAR, delegation_version BIGINT, PRIMARY KEY (principal, kind, value));
CREATE INDEX IF NOT EXISTS revoked_principal ON revoked (principal);
CREATE TABLE IF NOT EXISTS revocation_horizons (principal VARCHAR PRIMARY KEY, effective_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS entities (id VARCHAR PRIMARY KEY, aliases VARCHAR[], deleted BOOLEAN NOT NULL DEFAULT false);
CREATE TABLE IF NOT EXISTS policy_bundles (
  bundle_id VARCHAR PRIMARY KEY, version BIGINT, effective_at TIMESTAMPTZ, cedar VARCHAR,
  decision_types VARCHAR);
CREATE TABLE IF NOT EXISTS source_rules (bundle_id VARCHAR, provenance_group VARCHAR, classes VARCHAR[],
  PRIMARY KEY (bundle_id, provenance_group));
CREATE TABLE IF NOT EXISTS contracts (decision_type VARCHAR PRIMARY KEY, bundle_id VARCHAR, body VARCHAR);
CREATE TABLE IF NOT EXISTS policy_versions (bundle_id VARCHAR, version BIGINT, effective_at TIMESTAMPTZ,
  cedar VARCHAR, sources VARCHAR, source_trust BOOLEAN, PRIMARY KEY (bundle_id, version));
CREATE TABLE IF NOT EXISTS contract_versions (bundle_id VARCHAR, version BIGINT, decision_type VARCHAR,
  body VARCHAR, PRIMARY KEY (bundle_id, version, decision_type));
CREATE TABLE IF NOT EXISTS plans (
  plan_id VARCHAR PRIMARY KEY, plan_key VARCHAR, status VARCHAR, live BOOLEAN,
  valid_until TIMESTAMPTZ, request VARCHAR, plan VARCHAR, receipt_id VARCHAR, reason VARCHAR,
  cause VARCHAR, successor_plan_id VARCHAR, compiled_at TIMESTAMPTZ, invalidated_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS plan_heads (plan_key VARCHAR PRIMARY KEY, plan_id VARCHAR, live BOOLEAN,
  valid_until TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS dependency_index (dep_key VARCHAR, plan_key VARCHAR);
CREATE INDEX IF NOT EXISTS dependency_index_key ON dependency_index (dep_key);
CREATE TABLE IF NOT EXISTS receipts (receipt_id VARCHAR PRIMARY KEY, plan_id VARCHAR, receipt VARCHAR);
CREATE SEQUENCE IF NOT EXISTS outbox_seq;
CREATE TABLE IF NOT EXISTS outbox (seq BIGINT DEFAULT nextval('outbox_seq'), topic VARCHAR,
  key BLOB, value BLOB, src_topic VARCHAR, src_partition INTEGER, src_offset BIGINT,
  standby BOOLEAN NOT NULL DEFAULT false, lane INTEGER, to_partition INTEGER);
CREATE TABLE IF NOT EXISTS plan_feed (partition INTEGER PRIMARY KEY, next_offset BIGINT);
CREATE SEQUENCE IF NOT EXISTS recompile_queue_seq;
CREATE TABLE IF NOT EXISTS recompile_queue (plan_key VARCHAR PRIMARY KEY, src_topic VARCHAR, src_partition INTEGER,
  src_offset BIGINT, seq BIGINT DEFAULT nextval('recompile_queue_seq'));
CREATE TABLE IF NOT EXISTS offsets (topic VARCHAR, partition INTEGER, next_offset BIGINT,
  PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS incarnation (id INTEGER PRIMARY KEY, cluster_id VARCHAR, epoch BIGINT,
  rebased_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS applied_events (event_key VARCHAR PRIMARY KEY, topic VARCHAR, event_id VARCHAR,
  content_hash VARCHAR);
CREATE TABLE IF NOT EXISTS clock (id INTEGER PRIMARY KEY, now TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS counters (name VARCHAR PRIMARY KEY, value BIGINT);
"""
