-- 0008: a tenant's counts. A tenant-scoped dashboard counts one tenant's jobs by queue and
-- state; this index makes that an (index-only) walk of the tenant's own entries instead of the
-- whole table. Jobs without a tenant are not in it, so an app that never sets tenant_id pays
-- nothing.

CREATE INDEX x_jobs_tenant_idx ON {schema}.x_jobs (tenant_id, queue, state)
    WHERE tenant_id IS NOT NULL;
