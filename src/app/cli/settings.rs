//! The process's own settings as flags: database, HTTP, workers, the Authentik intake, Slurm.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::domain::{duration::parse_duration, secret::Secret};

#[derive(Clone, Debug, Args)]
pub struct DbArgs {
    /// PostgreSQL connection URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    pub database_url: Secret,
    /// Most database connections this process opens. Each webhook writer (api) and a worker's
    /// claimer and result writer keep one for good; at least 2 more are needed for the rest.
    #[arg(long, env = "ONRAMP_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,
}

#[derive(Clone, Debug, Args)]
pub struct HttpArgs {
    /// Address the HTTP server listens on.
    #[arg(long, env = "ONRAMP_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// An admin token for the /v1 API (at least 24 characters; prefer ONRAMP_API_TOKEN_FILE): valid
    /// while it is set, revoked when it is unset. Other tokens: `onramp token create`.
    #[arg(long, env = "ONRAMP_API_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub api_token: Option<Secret>,
    /// Longest an HTTP request may take (the live job stream is exempt).
    #[arg(long, env = "ONRAMP_HTTP_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub http_timeout: Duration,
    /// Largest API request body, in bytes (the webhook has ONRAMP_WEBHOOK_MAX_BODY).
    #[arg(long, env = "ONRAMP_HTTP_MAX_BODY", default_value_t = 1_048_576)]
    pub http_max_body: usize,
    /// Browser origins allowed to call the API (the portal), comma-separated, e.g.
    /// https://portal.example.org. None by default: no CORS headers.
    #[arg(long, env = "ONRAMP_CORS_ORIGINS", value_delimiter = ',', value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Longest a client may take to send a request's head (line and headers), from connecting or
    /// from the first byte of a later request; then the connection is closed.
    #[arg(long, env = "ONRAMP_HTTP_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub http_header_timeout: Duration,
    /// Longest pause while a request body is read; then 408 and the connection is closed.
    #[arg(long, env = "ONRAMP_HTTP_BODY_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub http_body_timeout: Duration,
    /// A connection with no request for this long is closed.
    #[arg(long, env = "ONRAMP_HTTP_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub http_idle_timeout: Duration,
    /// Most HTTP connections served at once; one more waits a second for a free slot, then is closed.
    #[arg(long, env = "ONRAMP_HTTP_MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub http_max_connections: u32,
    /// Most live job streams (/v1/stream) one token may have open at once; one more is 429.
    #[arg(long, env = "ONRAMP_HTTP_STREAMS_PER_TOKEN", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub http_streams_per_token: u32,
    /// A live job stream ends after this long (clients reconnect).
    #[arg(long, env = "ONRAMP_HTTP_STREAM_LIFETIME", default_value = "15m", value_parser = parse_duration)]
    pub http_stream_lifetime: Duration,
    /// Proxies (IP addresses or CIDR blocks, comma-separated) whose X-Forwarded-For names the
    /// client for the limit on failed logins. None by default: the peer address is the client.
    #[arg(long, env = "ONRAMP_HTTP_TRUSTED_PROXIES", value_delimiter = ',', value_name = "CIDR")]
    pub http_trusted_proxies: Vec<String>,
}

#[derive(Clone, Debug, Args)]
pub struct WorkerArgs {
    /// Worker identity in leases and the audit trail [default: <hostname>-<pid>].
    #[arg(long, env = "ONRAMP_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Steps one process runs at once. Slots are cheap: most steps wait on a backend, and each
    /// backend bounds its own load (Slurm writes one at a time in batches, key writes grouped per
    /// Secret, storage commands, Authentik requests, SMTP sessions).
    #[arg(long, env = "ONRAMP_WORKER_CONCURRENCY", default_value_t = 512, value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_concurrency: u16,
    /// Lease of a claimed step; renewed every third of it. A dead worker's steps run again after it.
    #[arg(long, env = "ONRAMP_LEASE", default_value = "10s", value_parser = parse_duration)]
    pub lease: Duration,
    /// How often idle workers look for due work when no notification arrives.
    #[arg(long, env = "ONRAMP_POLL_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// At SIGTERM, how long running steps may take to finish before their leases are released.
    #[arg(long, env = "ONRAMP_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Where a worker-only process (--role worker) serves /metrics, /healthz and /readyz.
    #[arg(long, env = "ONRAMP_WORKER_LISTEN", default_value = "0.0.0.0:9090")]
    pub worker_listen: SocketAddr,
    /// Succeeded and cancelled jobs, with their attempts and audit trail, are deleted this long
    /// after they finished (at least 1d); failed jobs wait for a person and are kept.
    #[arg(long, env = "ONRAMP_RETENTION_JOBS", default_value = "90d", value_parser = parse_duration)]
    pub retention_jobs: Duration,
    /// Stored webhook deliveries are deleted this long after they arrived (at least 1d).
    #[arg(long, env = "ONRAMP_RETENTION_DELIVERIES", default_value = "14d", value_parser = parse_duration)]
    pub retention_deliveries: Duration,
    /// How often workers prune by the two retention settings (also once at start); 0s: never.
    #[arg(long, env = "ONRAMP_RETENTION_INTERVAL", default_value = "1h", value_parser = parse_duration)]
    pub retention_interval: Duration,
    /// Longest one callback POST to a portal may take (connecting included).
    #[arg(long, env = "ONRAMP_CALLBACK_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub callback_timeout: Duration,
    /// Attempts of one callback event before it is given up on (counted per subscription).
    #[arg(long, env = "ONRAMP_CALLBACK_MAX_ATTEMPTS", default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..))]
    pub callback_max_attempts: u32,
    /// Delay before a failed callback's first retry; doubled per attempt (jittered).
    #[arg(long, env = "ONRAMP_CALLBACK_BACKOFF", default_value = "1s", value_parser = parse_duration)]
    pub callback_backoff: Duration,
    /// Longest delay between attempts of a callback, a receiver's Retry-After included.
    #[arg(long, env = "ONRAMP_CALLBACK_MAX_BACKOFF", default_value = "10m", value_parser = parse_duration)]
    pub callback_max_backoff: Duration,
    /// How often workers look for new job events to deliver as callbacks.
    #[arg(long, env = "ONRAMP_CALLBACK_POLL", default_value = "1s", value_parser = parse_duration)]
    pub callback_poll: Duration,
    /// How long callbacks wait for a job event whose id is missing (its transaction not yet
    /// committed) before going on without it.
    #[arg(long, env = "ONRAMP_CALLBACK_SETTLE", default_value = "30s", value_parser = parse_duration)]
    pub callback_settle: Duration,
}

/// Authentik intake: the webhook, the API client, the tenant registry and reconcile. Enabled when
/// the tenant registry, the Authentik URL and its token are all set.
#[derive(Clone, Debug, Args)]
pub struct IntakeArgs {
    /// Tenant registry (YAML) mapping Authentik groups to tenants and Slurm accounts.
    #[arg(long, env = "ONRAMP_TENANTS", value_name = "FILE")]
    pub tenants: Option<PathBuf>,
    /// Authentik's base URL, e.g. https://auth.example.org.
    #[arg(long, env = "ONRAMP_AUTHENTIK_URL", value_name = "URL")]
    pub authentik_url: Option<String>,
    /// Authentik API token (prefer the file).
    #[arg(long, env = "ONRAMP_AUTHENTIK_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub authentik_token: Option<Secret>,
    /// File holding the Authentik API token.
    #[arg(long, env = "ONRAMP_AUTHENTIK_TOKEN_FILE", value_name = "FILE", conflicts_with = "authentik_token")]
    pub authentik_token_file: Option<PathBuf>,
    /// Timeout of one Authentik API request.
    #[arg(long, env = "ONRAMP_AUTHENTIK_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub authentik_timeout: Duration,
    /// Attempts of an Authentik API request on 5xx, 429 or a transport error.
    #[arg(long, env = "ONRAMP_AUTHENTIK_ATTEMPTS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub authentik_attempts: u32,
    /// Authentik API requests in flight at once per process; the rest wait their turn.
    #[arg(long, env = "ONRAMP_AUTHENTIK_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub authentik_concurrency: u16,
    /// Standard Webhooks signing secrets (whsec_…), comma-separated; several during a rotation.
    #[arg(long, env = "ONRAMP_WEBHOOK_SECRETS", hide_env_values = true, value_delimiter = ',', value_name = "WHSEC")]
    pub webhook_secrets: Vec<Secret>,
    /// Bearer tokens accepted on the webhook, comma-separated. With secrets too, both are required.
    #[arg(long, env = "ONRAMP_WEBHOOK_TOKENS", hide_env_values = true, value_delimiter = ',', value_name = "TOKEN")]
    pub webhook_tokens: Vec<Secret>,
    /// Largest accepted distance between webhook-timestamp and now.
    #[arg(long, env = "ONRAMP_WEBHOOK_TOLERANCE", default_value = "5m", value_parser = parse_duration)]
    pub webhook_tolerance: Duration,
    /// Largest accepted webhook body, in bytes.
    #[arg(long, env = "ONRAMP_WEBHOOK_MAX_BODY", default_value_t = 1_048_576)]
    pub webhook_max_body: usize,
    /// Reconcile jobs from a webhook run this long after it (Authentik logs some events before
    /// the change is visible; bursts collapse into one job).
    #[arg(long, env = "ONRAMP_WEBHOOK_SETTLE", default_value = "2s", value_parser = parse_duration)]
    pub webhook_settle: Duration,
    /// A group change listing more users than this reconciles the group's tenants (one job, with
    /// the safety brake) instead of each user (one job and one lock each).
    #[arg(long, env = "ONRAMP_WEBHOOK_MAX_DIFF_USERS", default_value_t = 200, value_parser = clap::value_parser!(u16).range(1..))]
    pub webhook_max_diff_users: u16,
    /// Tasks writing webhook deliveries; each writes everything queued in one transaction. One
    /// writer was the fastest on two cores: more split what is queued into smaller transactions.
    #[arg(long, env = "ONRAMP_WEBHOOK_WRITERS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub webhook_writers: u16,
    /// Most deliveries written in one transaction.
    #[arg(long, env = "ONRAMP_WEBHOOK_BATCH", default_value_t = 512, value_parser = clap::value_parser!(u16).range(1..))]
    pub webhook_batch: u16,
    /// How often the full reconcile runs (also once at start); 0s turns the periodic run off.
    #[arg(long, env = "ONRAMP_RECONCILE_INTERVAL", default_value = "15m", value_parser = parse_duration)]
    pub reconcile_interval: Duration,
    /// Safety brake: reconciles start at most the larger of this many offboardings …
    #[arg(long, env = "ONRAMP_BRAKE_MIN_USERS", default_value_t = 5)]
    pub brake_min_users: usize,
    /// … and this share (percent) of the managed users per ONRAMP_BRAKE_WINDOW, across all
    /// tenants and replicas; further ones wait for one approval. A pass that would offboard more
    /// than both of one tenant's users is held whole.
    #[arg(long, env = "ONRAMP_BRAKE_MAX_PERCENT", default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub brake_max_percent: u32,
    /// Safety brake: the window its offboarding budget is counted over.
    #[arg(long, env = "ONRAMP_BRAKE_WINDOW", default_value = "1h", value_parser = parse_duration)]
    pub brake_window: Duration,
}

/// The Slurm route's name on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SlurmVia {
    KubeExec,
    Local,
    Ssh,
}

#[derive(Clone, Debug, Args)]
pub struct SlurmArgs {
    /// The Slurm cluster onramp manages (ClusterName in slurm.conf).
    #[arg(long, env = "ONRAMP_SLURM_CLUSTER", default_value = "production")]
    pub slurm_cluster: String,
    /// How onramp reaches Slurm's commands, for every Slurm call (flows, reconcile, doctor):
    /// `kube-exec` in a Ready pod of the slurmctld Deployment (ONRAMP_SLURM_NAMESPACE,
    /// ONRAMP_SLURMCTLD_DEPLOYMENT); `local` on this host's PATH (beside a bare-metal
    /// slurmctld); `ssh` to a controller host (ONRAMP_SLURM_SSH_*).
    #[arg(long, env = "ONRAMP_SLURM_VIA", default_value = "kube-exec", value_name = "ROUTE")]
    pub slurm_via: SlurmVia,
    /// `ssh` route: the controller host.
    #[arg(long, env = "ONRAMP_SLURM_SSH_HOST", value_name = "HOST")]
    pub slurm_ssh_host: Option<String>,
    /// `ssh` route: the remote user [default: ssh's own default].
    #[arg(long, env = "ONRAMP_SLURM_SSH_USER", value_name = "USER")]
    pub slurm_ssh_user: Option<String>,
    /// `ssh` route: the controller's SSH port.
    #[arg(long, env = "ONRAMP_SLURM_SSH_PORT", default_value_t = 22)]
    pub slurm_ssh_port: u16,
    /// `ssh` route: the private key file (mode 0600 or stricter).
    #[arg(long, env = "ONRAMP_SLURM_SSH_KEY_FILE", value_name = "FILE")]
    pub slurm_ssh_key_file: Option<PathBuf>,
    /// `ssh` route: the known_hosts file holding the controller's host key (the only key trusted).
    #[arg(long, env = "ONRAMP_SLURM_SSH_KNOWN_HOSTS", value_name = "FILE")]
    pub slurm_ssh_known_hosts: Option<PathBuf>,
    /// How long one Slurm command may take.
    #[arg(long, env = "ONRAMP_SLURM_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub slurm_timeout: Duration,
    /// How long the first of several concurrent association creations for one account waits
    /// for the others, to add them all in one `sacctmgr add user a,b,c`.
    #[arg(long, env = "ONRAMP_SLURM_BATCH_WINDOW", default_value = "250ms", value_parser = parse_duration)]
    pub slurm_batch_window: Duration,
}
