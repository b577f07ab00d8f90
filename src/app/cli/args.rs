//! The subcommands' arguments.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use super::backends::BackendArgs;
use super::settings::{DbArgs, HttpArgs, IntakeArgs, SlurmArgs, WorkerArgs};
use crate::domain::duration::parse_duration;

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
    #[command(flatten)]
    pub backends: BackendArgs,
}

#[derive(Clone, Debug, Args)]
#[command(after_help = "Exit status: 0 every check ok; 1 warnings only; 2 a critical finding; 3 something could not \
be checked (Slurm unreachable, a file or pod not readable) and nothing critical was found. Checks not \
attempted (no Kubernetes API, no tenant registry) are listed as skipped and do not change it.\n\
Kubernetes is read when ONRAMP_KUBECONFIG is set, the route is kube-exec, or onramp runs in a pod.")]
pub struct DoctorArgs {
    #[command(flatten)]
    pub slurm: SlurmArgs,
    /// The Kubernetes connection: the kube-exec route, and the login and slurmd pods' checks.
    #[command(flatten, next_help_heading = "Kubernetes")]
    pub k8s: super::backends::K8sArgs,
    /// cgroup.conf on the Slurm host [default: beside slurm.conf].
    #[arg(long, env = "ONRAMP_SLURM_CGROUP_CONF", value_name = "PATH")]
    pub cgroup_conf: Option<String>,
    /// Tenant registry (YAML): its tenants' login pods are checked.
    #[arg(long, env = "ONRAMP_TENANTS", value_name = "PATH")]
    pub tenants: Option<PathBuf>,
    /// Namespace of the slurmd pods [default: ONRAMP_SLURM_NAMESPACE].
    #[arg(long, env = "ONRAMP_SLURMD_NAMESPACE")]
    pub slurmd_namespace: Option<String>,
    /// Label selector of the slurmd pods (the Slinky operator's NodeSet pods by default).
    #[arg(long, env = "ONRAMP_SLURMD_SELECTOR", default_value = "app.kubernetes.io/name=slurmd")]
    pub slurmd_selector: String,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ServeRole {
    /// HTTP only: webhooks, API, dashboard, health and metrics.
    Api,
    /// Workers only: claim and run steps.
    Worker,
    /// Both in one process.
    Both,
}

#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// What this process does.
    #[arg(long, env = "ONRAMP_ROLE", default_value = "both")]
    pub role: ServeRole,
    /// Apply pending migrations at start (safe with several replicas: they take a lock).
    #[arg(long, env = "ONRAMP_MIGRATE", default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate: bool,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub worker: WorkerArgs,
    #[command(flatten)]
    pub intake: IntakeArgs,
    #[command(flatten)]
    pub backends: BackendArgs,
}

#[derive(Clone, Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub intake: IntakeArgs,
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
    /// dev's folder: the demo tenant registry, the settings the CLI finds while dev runs, and the
    /// private PostgreSQL's data (as root, that data is in /var/tmp/onramp-dev-<hash of this
    /// folder>, owned by postgres). `onramp dev` never uses another database: it migrates, mints an
    /// admin token and runs a worker on simulated backends, which must not touch a real onramp's
    /// jobs (DATABASE_URL is ignored).
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
    /// List the newest jobs: id, state, kind, subject, step, age and why the job is where it is.
    List {
        /// Only jobs in this state (pending, running, waiting, needs_approval, failed, succeeded,
        /// cancelled).
        #[arg(long)]
        state: Option<String>,
        /// How many (1 to 500).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
        /// Print the jobs as JSON, each with its `reason`.
        #[arg(long)]
        json: bool,
    },
    /// Show one job: its steps with their attempts, outcomes, errors and effects, and its audit
    /// trail.
    Show {
        id: i64,
        /// Print the job, its attempts and its audit trail as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel an unfinished job.
    Cancel {
        id: i64,
        /// Recorded in the audit trail.
        #[arg(long)]
        reason: Option<String>,
        /// Print the job as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a failed job again from the step that failed.
    Retry {
        id: i64,
        /// Print the job as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve the step a job is waiting on.
    Approve {
        id: i64,
        /// Print the job as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Debug, Args)]
pub struct TokenArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Tenant registry (YAML): a token's --tenant must be one of its tenants.
    #[arg(long, env = "ONRAMP_TENANTS", value_name = "PATH")]
    pub tenants: Option<PathBuf>,
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
