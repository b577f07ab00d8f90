//! The command line: subcommands, their settings (each with an environment variable and a
//! default), and one-line errors. Nothing below `app` sees these types: each group converts into
//! the plain settings of the part it configures.

mod args;
mod backends;
mod secret_files;
mod settings;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

pub use args::{
    DevArgs, DoctorArgs, JobsAction, JobsArgs, PlanArgs, ReconcileArgs, ServeArgs, ServeRole, TenantAction, TenantArgs,
    TokenAction, TokenArgs,
};
pub use backends::{BackendArgs, FlowArgs, K8sArgs, NotifyArgs, StorageArgs};
pub use settings::{DbArgs, HttpArgs, IntakeArgs, SlurmArgs, SlurmVia, WorkerArgs};

#[derive(Debug, Parser)]
#[command(
    name = "onramp",
    version,
    about = "Onboards and offboards users and tenants of a multi-tenant Slurm GPU cluster, driven by Authentik.",
    after_help = "Every setting can also come from its environment variable, or from a settings file of NAME=value lines (--config); the environment wins over the file. Secrets can also be read from a file named by NAME_FILE: DATABASE_URL_FILE, ONRAMP_API_TOKEN_FILE, ONRAMP_WEBHOOK_SECRETS_FILE, ONRAMP_WEBHOOK_TOKENS_FILE, ONRAMP_SMTP_URL_FILE, ONRAMP_SLACK_WEBHOOK_URL_FILE (and --authentik-token-file)."
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
    /// Not a flag: the folder of the running `onramp dev` whose settings this command uses.
    #[arg(skip)]
    pub dev_world: Option<PathBuf>,
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
    /// Check the cluster (Slurm's configuration, the login and slurmd pods) for every failure
    /// mode the runbook names; exit 2 on a critical finding, 1 on warnings only.
    Doctor(Box<DoctorArgs>),
    /// Print every command and API request a flow would make, in order, with its waits, without
    /// doing anything (the flow's own steps, run against a simulation).
    #[command(
        after_help = "The plan's commands follow the backend settings of `onramp serve` (Kubernetes, storage, notifications, Slurm, the flows' waits; see `onramp serve --help`), read from the same environment or settings file."
    )]
    Plan(Box<PlanArgs>),
}

/// Parses the command line after loading the settings file and the `*_FILE` secrets into the
/// environment.
/// On a mistake, prints one line naming the setting and exits with status 2.
pub fn parse() -> Cli {
    let args: Vec<OsString> = std::env::args_os().collect();
    let dev_world = match load_settings_file(&args).and_then(|dev| secret_files::load().map(|()| dev)) {
        Ok(dev) => dev,
        Err(e) => {
            eprintln!("onramp: {e}");
            std::process::exit(2);
        }
    };
    match command().try_get_matches_from(&args).and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m)) {
        Ok(cli) => Cli { dev_world, ..cli },
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            eprintln!("onramp: {}", one_line(&e));
            std::process::exit(2);
        }
    }
}

/// The command line as `--help` shows it: each command lists the settings it uses. Some groups
/// of settings are shared (the intake's, the backends'); a command that takes a group but does not
/// use all of it still accepts the rest (one settings file serves every command) without listing it.
pub fn command() -> clap::Command {
    let intake_only_serve: &[&str] = &[
        "webhook_secrets",
        "webhook_tokens",
        "webhook_tolerance",
        "webhook_max_body",
        "webhook_settle",
        "webhook_max_diff_users",
        "webhook_writers",
        "webhook_batch",
        "reconcile_interval",
        "brake_min_users",
        "brake_max_percent",
        "brake_window",
    ];
    let k8s_not_for_doctor: &[&str] = &[
        "home_root",
        "skel_dir",
        "login_run_as",
        "smoke_gres",
        "manage_keys",
        "slurm_cluster_resource",
        "reservation_resource",
        "nodeset_resource",
        "slurm_batch_window",
    ];
    let backends = <BackendArgs as clap::Args>::augment_args(clap::Command::new("backends"));
    let backends: Vec<&str> = backends.get_arguments().map(|a| a.get_id().as_str()).collect();
    let pool = &["db_pool_size"][..];
    let unused: [(&str, Vec<&str>); 7] = [
        ("migrate", pool.to_vec()),
        ("jobs", pool.to_vec()),
        ("token", pool.to_vec()),
        ("tenant", pool.to_vec()),
        ("reconcile", [pool, intake_only_serve].concat()),
        ("doctor", k8s_not_for_doctor.to_vec()),
        ("plan", [intake_only_serve, &backends].concat()),
    ];
    let mut cmd = <Cli as clap::CommandFactory>::command();
    for (name, ids) in unused {
        cmd = cmd.mut_subcommand(name, |sub| ids.iter().fold(sub, |sub, id| sub.mut_arg(*id, |a| a.hide(true))));
    }
    cmd.mut_subcommand("dev", |sub| sub.mut_arg("worker_listen", |a| a.hide(true)))
}

/// Loads `--config` (or `ONRAMP_CONFIG`), else the settings of a running `onramp dev` found from
/// here (see `devworld`), whose folder it returns.
fn load_settings_file(args: &[OsString]) -> Result<Option<PathBuf>, String> {
    let from_args = args.iter().enumerate().find_map(|(i, a)| {
        let a = a.to_str()?;
        if a == "--config" {
            args.get(i + 1).map(PathBuf::from)
        } else {
            a.strip_prefix("--config=").map(PathBuf::from)
        }
    });
    let mut dev_world = None;
    let explicit = from_args.or_else(|| std::env::var_os("ONRAMP_CONFIG").map(PathBuf::from));
    let Some(path) = explicit.or_else(|| {
        let cwd = std::env::current_dir().ok()?;
        let found = crate::app::devworld::settings_for(args, |k| std::env::var_os(k), &cwd)?;
        dev_world = found.parent().map(PathBuf::from);
        Some(found)
    }) else {
        return Ok(None);
    };
    for (k, v) in super::settings_file::read_settings_file(&path)? {
        if std::env::var_os(&k).is_none() {
            // SAFETY: called from `main` before the runtime or any other thread starts.
            unsafe { std::env::set_var(k, v) };
        }
    }
    Ok(dev_world)
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
        // every setting left out of a command's help is one of its settings
        command().debug_assert();
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
        assert_eq!(a.backends.k8s.slurmctld_deployment, "ctld");
        assert_eq!(a.backends.storage.storage_backend, crate::backends::storage::Backend::Lustre);
        assert!(a.backends.notify.smtp_url.is_some() && a.backends.notify.slack_webhook_url.is_none());
        let help = Cli::command().find_subcommand_mut("serve").unwrap().render_long_help().to_string();
        for s in ["ONRAMP_KUBECONFIG", "ONRAMP_WEKA_BIN", "ONRAMP_SMTP_URL", "[default: slurm-control]"] {
            assert!(help.contains(s), "serve --help lacks {s}");
        }
    }
}
