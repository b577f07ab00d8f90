-- The users API reads each user's (subject's) latest jobs of a tenant: by tenant and subject,
-- newest first, without scanning the tenant's history in id order.
create index jobs_tenant_subject on jobs (tenant, subject, id desc);
