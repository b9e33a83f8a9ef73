-- ultimat3-jobs SQLite schema, version 8: a tenant's counts.
--
-- A tenant-scoped dashboard counts one tenant's jobs by queue and state; this index makes that
-- a walk of the tenant's own entries (covering: no table row is read) instead of the whole
-- table. Jobs without a tenant are not in it, so an app that never sets tenant_id pays nothing.

CREATE INDEX x_jobs_tenant ON x_jobs (tenant_id, queue, state) WHERE tenant_id IS NOT NULL;
