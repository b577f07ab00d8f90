//! The command line: subcommands, their settings (each with an environment variable and a
//! default), and one-line errors.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::domain::{duration::parse_duration, secret::Secret};

#[derive(Debug, Parser)]
#[command(
    name = "onramp",
    version,
    about = "Onboards and offboards users and tenants of a multi-tenant Slurm GPU cluster, driven by Authentik.",
    after_help = "Every setting can also come from its environment variable, or from a settings file of NAME=value lines (--config); the environment wins over the file."
)]
pub struct Cli {
    /// Settings file of NAME=value lines, using the environment variable names shown here.
    #[arg(long, env = "ONRAMP_CONFIG", global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log filter, e.g. info or onramp=debug,sqlx=warn.
    #[arg(long, env = "ONRAMP_LOG", default_value = "info", global = true)]
    pub log: String,
    /// Log format.
    #[arg(long, env = "ONRAMP_LOG_FORMAT", default_value = "text", global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the database migrations and exit.
    Migrate(DbArgs),
    /// Run the service: HTTP API, workers, or both.
    Serve(Box<ServeArgs>),
    /// Try onramp on this machine: a private PostgreSQL, the service, and sample jobs.
    Dev(DevArgs),
    /// Look at and act on jobs from the command line.
    Jobs(JobsArgs),
    /// Create, list and revoke API tokens.
    Token(TokenArgs),
    /// Reconcile Authentik against the cluster now: enqueue a reconcile job (all tenants, one
    /// tenant or one user) for the workers of `onramp serve`.
    Reconcile(Box<ReconcileArgs>),
    /// Onboard or offboard a whole tenant of the registry: enqueue the job for the workers.
    Tenant(TenantArgs),
    /// Check the Slurm cluster's configuration for the multi-tenancy pitfalls; fails when a
    /// must-have is missing.
    Doctor(DoctorArgs),
    /// Print every command and API request a flow would make, in order, with its waits, without
    /// doing anything (the flow's own steps, run against a simulation).
    Plan(Box<PlanArgs>),
}

#[derive(Clone, Debug, Args)]
pub struct PlanArgs {
    /// user.onboard, user.offboard, tenant.onboard or tenant.offboard.
    pub flow: String,
    /// The tenant (from the tenant registry).
    #[arg(long)]
    pub tenant: String,
    /// The user, for the user flows.
    #[arg(long)]
    pub user: Option<String>,
    /// The user's team account [default: where their Authentik groups place them, else the
    /// tenant's account].
    #[arg(long)]
    pub account: Option<String>,
    /// Plan an offboarding that cancels running jobs at once.
    #[arg(long)]
    pub hard_cutoff: bool,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// The tenant registry and, when set, Authentik (read only, for the user's groups and key).
    #[command(flatten)]
    pub intake: IntakeArgs,
    #[command(flatten, next_help_heading = "Kubernetes")]
    pub k8s: crate::backends::kubernetes::K8sArgs,
    #[command(flatten, next_help_heading = "Storage")]
    pub storage: crate::backends::storage::StorageArgs,
    #[command(flatten, next_help_heading = "Notifications")]
    pub notify: crate::backends::notify::NotifyArgs,
    #[command(flatten, next_help_heading = "Slurm")]
    pub slurm: SlurmArgs,
    #[command(flatten, next_help_heading = "Flows")]
    pub flows: crate::flows::settings::FlowArgs,
}

#[derive(Clone, Debug, Args)]
pub struct SlurmArgs {
    /// The Slurm cluster onramp manages (ClusterName in slurm.conf).
    #[arg(long, env = "ONRAMP_SLURM_CLUSTER", default_value = "production")]
    pub slurm_cluster: String,
    /// How long one Slurm command may take.
    #[arg(long, env = "ONRAMP_SLURM_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub slurm_timeout: Duration,
    /// How long the first of several concurrent association creations for one account waits
    /// for the others, to add them all in one `sacctmgr add user a,b,c`.
    #[arg(long, env = "ONRAMP_SLURM_BATCH_WINDOW", default_value = "250ms", value_parser = parse_duration)]
    pub slurm_batch_window: Duration,
}

#[derive(Clone, Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub slurm: SlurmArgs,
    /// cgroup.conf on the Slurm host [default: beside slurm.conf].
    #[arg(long, env = "ONRAMP_SLURM_CGROUP_CONF", value_name = "PATH")]
    pub cgroup_conf: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Debug, Args)]
pub struct DbArgs {
    /// PostgreSQL connection URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    pub database_url: Secret,
    /// Most database connections this process opens.
    #[arg(long, env = "ONRAMP_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// HTTP only: webhooks, API, dashboard, health and metrics.
    Api,
    /// Workers only: claim and run steps.
    Worker,
    /// Both in one process.
    Both,
}

#[derive(Clone, Debug, Args)]
pub struct HttpArgs {
    /// Address the HTTP server listens on.
    #[arg(long, env = "ONRAMP_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Bearer token for the /v1 API. Without it the API answers 503.
    #[arg(long, env = "ONRAMP_API_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub api_token: Option<Secret>,
}

#[derive(Clone, Debug, Args)]
pub struct WorkerArgs {
    /// Worker identity in leases and the audit trail [default: <hostname>-<pid>].
    #[arg(long, env = "ONRAMP_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Steps one process runs at once.
    #[arg(long, env = "ONRAMP_WORKER_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
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
}

#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// What this process does.
    #[arg(long, env = "ONRAMP_ROLE", default_value = "both")]
    pub role: Role,
    /// Apply pending migrations at start (safe with several replicas: they take a lock).
    #[arg(long, env = "ONRAMP_MIGRATE", default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate: bool,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub worker: WorkerArgs,
    #[command(flatten)]
    pub intake: IntakeArgs,
    #[command(flatten, next_help_heading = "Kubernetes")]
    pub k8s: crate::backends::kubernetes::K8sArgs,
    #[command(flatten, next_help_heading = "Storage")]
    pub storage: crate::backends::storage::StorageArgs,
    #[command(flatten, next_help_heading = "Notifications")]
    pub notify: crate::backends::notify::NotifyArgs,
    #[command(flatten, next_help_heading = "Slurm")]
    pub slurm: SlurmArgs,
    #[command(flatten, next_help_heading = "Flows")]
    pub flows: crate::flows::settings::FlowArgs,
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
    /// Tasks writing webhook deliveries; each writes everything queued in one transaction.
    #[arg(long, env = "ONRAMP_WEBHOOK_WRITERS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub webhook_writers: u16,
    /// Most deliveries written in one transaction.
    #[arg(long, env = "ONRAMP_WEBHOOK_BATCH", default_value_t = 512, value_parser = clap::value_parser!(u16).range(1..))]
    pub webhook_batch: u16,
    /// How often the full reconcile runs (also once at start); 0s turns the periodic run off.
    #[arg(long, env = "ONRAMP_RECONCILE_INTERVAL", default_value = "15m", value_parser = parse_duration)]
    pub reconcile_interval: Duration,
    /// Safety brake: a pass may offboard at most this many users of a tenant …
    #[arg(long, env = "ONRAMP_BRAKE_MIN_USERS", default_value_t = 5)]
    pub brake_min_users: usize,
    /// … or at most this share (percent) of its users; beyond both it waits for approval.
    #[arg(long, env = "ONRAMP_BRAKE_MAX_PERCENT", default_value_t = 10)]
    pub brake_max_percent: u32,
    /// Timeout of one sacctmgr call (the cluster's associations, one bulk read per pass).
    #[arg(long, env = "ONRAMP_SACCTMGR_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub sacctmgr_timeout: Duration,
}

#[derive(Clone, Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub intake: IntakeArgs,
    /// The cluster whose associations reconcile reads.
    #[command(flatten, next_help_heading = "Slurm")]
    pub slurm: SlurmArgs,
    /// Only this tenant.
    #[arg(long, conflicts_with = "user")]
    pub tenant: Option<String>,
    /// Only this user (Authentik pk).
    #[arg(long)]
    pub user: Option<i64>,
    /// Wait until the job has finished and print its decision.
    #[arg(long)]
    pub wait: bool,
}

#[derive(Clone, Debug, Args)]
pub struct TenantArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Tenant registry (YAML): the tenant must be in it.
    #[arg(long, env = "ONRAMP_TENANTS", value_name = "PATH")]
    pub tenants: PathBuf,
    #[command(subcommand)]
    pub action: TenantAction,
}

#[derive(Clone, Debug, Subcommand)]
pub enum TenantAction {
    /// Accounts with limits, NetworkPolicy, scratch quota, then the group's members.
    Onboard { tenant: String },
    /// Block, cancel, drain, archive, release, keep for the retention period, delete.
    Offboard {
        tenant: String,
        /// Cancel running jobs at once instead of draining them (no approval asked).
        #[arg(long)]
        hard_cutoff: bool,
    },
}

#[derive(Clone, Debug, Args)]
pub struct DevArgs {
    /// Use this PostgreSQL instead of starting a private one.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_name = "URL")]
    pub database_url: Option<Secret>,
    /// Where the private PostgreSQL keeps its data.
    #[arg(long, env = "ONRAMP_DEV_DIR", default_value = ".onramp-dev")]
    pub dev_dir: PathBuf,
    /// Address the HTTP server listens on.
    #[arg(long, env = "ONRAMP_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub worker: WorkerArgs,
}

#[derive(Clone, Debug, Args)]
pub struct JobsArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(subcommand)]
    pub action: JobsAction,
}

#[derive(Clone, Debug, Subcommand)]
pub enum JobsAction {
    /// List the newest jobs.
    List {
        /// Only jobs in this state.
        #[arg(long)]
        state: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one job with its steps, attempts and audit trail.
    Show { id: i64 },
    /// Cancel an unfinished job.
    Cancel {
        id: i64,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Run a failed job again from the step that failed.
    Retry { id: i64 },
    /// Approve the step a job is waiting on.
    Approve { id: i64 },
}

#[derive(Clone, Debug, Args)]
pub struct TokenArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(subcommand)]
    pub action: TokenAction,
}

#[derive(Clone, Debug, Subcommand)]
pub enum TokenAction {
    /// Create a token and print it (the only time it is shown).
    Create {
        /// A unique name, recorded as the actor of what the token does.
        #[arg(long)]
        name: String,
        /// admin (also manages tokens), operator (also starts, retries, cancels, approves) or viewer (reads).
        #[arg(long)]
        role: String,
        /// Limit the token to one tenant's jobs.
        #[arg(long)]
        tenant: Option<String>,
        /// Expire after this long (e.g. 90d).
        #[arg(long, value_parser = parse_duration)]
        expires: Option<Duration>,
    },
    /// List tokens (never the tokens themselves).
    List,
    /// Revoke a token by name; it stops working at once.
    Revoke { name: String },
}

/// Parses the command line after loading the settings file into the environment.
/// On a mistake, prints one line naming the setting and exits with status 2.
pub fn parse() -> Cli {
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Err(e) = load_settings_file(&args) {
        eprintln!("onramp: {e}");
        std::process::exit(2);
    }
    match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            eprintln!("onramp: {}", one_line(&e));
            std::process::exit(2);
        }
    }
}

fn load_settings_file(args: &[OsString]) -> Result<(), String> {
    let from_args = args.iter().enumerate().find_map(|(i, a)| {
        let a = a.to_str()?;
        if a == "--config" {
            args.get(i + 1).map(PathBuf::from)
        } else {
            a.strip_prefix("--config=").map(PathBuf::from)
        }
    });
    let Some(path) = from_args.or_else(|| std::env::var_os("ONRAMP_CONFIG").map(PathBuf::from)) else {
        return Ok(());
    };
    for (k, v) in super::settings_file::read_settings_file(&path)? {
        if std::env::var_os(&k).is_none() {
            // SAFETY: called from `main` before the runtime or any other thread starts.
            unsafe { std::env::set_var(k, v) };
        }
    }
    Ok(())
}

/// clap's message without the usage block, plus the environment variable of the setting.
fn one_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let args: Vec<String> = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => vec![],
    };
    let with_env = |arg: &str| {
        let long = arg.split_whitespace().next().unwrap_or("").trim_start_matches("--");
        match find_env(&<Cli as clap::CommandFactory>::command(), long) {
            Some(env) => format!("{arg} (environment: {env})"),
            None => arg.to_string(),
        }
    };
    if e.kind() == ErrorKind::MissingRequiredArgument && !args.is_empty() {
        let names: Vec<String> = args.iter().map(|a| with_env(a)).collect();
        return format!("missing setting: {}", names.join(", "));
    }
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid command line").trim_start_matches("error: ");
    match args.first() {
        Some(arg) => {
            let named = with_env(arg);
            if named.len() > arg.len() { format!("{first}{}", &named[arg.len()..]) } else { first.to_string() }
        }
        None => first.to_string(),
    }
}

fn find_env(cmd: &clap::Command, long: &str) -> Option<String> {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .or_else(|| cmd.get_subcommands().find_map(|s| find_env(s, long)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn malformed_setting_is_one_line_naming_it() {
        let e =
            Cli::try_parse_from(["onramp", "serve", "--database-url", "postgres://x", "--lease", "ten"]).unwrap_err();
        let line = one_line(&e);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("--lease") && line.contains("ONRAMP_LEASE"), "{line}");
    }

    #[test]
    fn backend_settings_are_serve_flags() {
        let cli = Cli::try_parse_from([
            "onramp",
            "serve",
            "--database-url",
            "postgres://x",
            "--storage-backend",
            "lustre",
            "--slurmctld-deployment",
            "ctld",
            "--smtp-url",
            "smtp://127.0.0.1:25",
        ])
        .unwrap();
        let Command::Serve(a) = cli.command else { panic!("not serve") };
        assert_eq!(a.k8s.slurmctld_deployment, "ctld");
        assert_eq!(a.storage.storage_backend, crate::backends::storage::Backend::Lustre);
        assert!(a.notify.smtp_url.is_some() && a.notify.slack_webhook_url.is_none());
        let help = Cli::command().find_subcommand_mut("serve").unwrap().render_long_help().to_string();
        for s in ["ONRAMP_KUBECONFIG", "ONRAMP_WEKA_BIN", "ONRAMP_SMTP_URL", "[default: slurm-control]"] {
            assert!(help.contains(s), "serve --help lacks {s}");
        }
    }
}
