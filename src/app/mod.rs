//! The application: the command line, settings and the composition root that builds the world
//! (backends → registry → engine → routers) for `serve`, `dev`, plans and the CLI's commands.

pub mod admin;
pub mod cli;
pub mod db;
pub mod dev;
pub mod devpg;
pub mod devworld;
pub mod intake;
pub mod jobs_view;
pub mod login;
pub mod output;
pub mod retention;
pub mod serve;
pub mod settings;
mod settings_file;
pub mod slurm_route;
pub mod telemetry;
pub mod world;

use std::process::ExitCode;

use clap::ValueEnum;
use cli::{Cli, Command};

/// What the process is, as its traces say (`onramp.role`).
fn role(command: &Command) -> String {
    match command {
        Command::Serve(a) => a.role.to_possible_value().map_or("serve".into(), |v| v.get_name().to_string()),
        Command::Dev(_) => "dev".into(),
        _ => "cli".into(),
    }
}

/// Runs a parsed command line; errors are printed as one line.
pub fn run(cli: Cli) -> ExitCode {
    // A plan prints the plan; the simulation's own log (its "writes") would only confuse.
    let log = match (&cli.command, cli.log.as_str()) {
        (Command::Plan(_), "info") => "warn",
        (_, l) => l,
    };
    let otel = match telemetry::OtelSettings::from_env(&role(&cli.command)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("onramp: {e}");
            return ExitCode::from(2);
        }
    };
    let telemetry = match telemetry::init(log, cli.log_format, otel.as_ref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("onramp: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("onramp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dev_world = cli.dev_world;
    let result = rt.block_on(async {
        let done = match cli.command {
            Command::Migrate(a) => {
                let pool = db::connect(&a.database_url, 2).await?;
                db::migrate(&pool).await?;
                eprintln!("onramp: migrations applied to {}", db::describe(&a.database_url));
                Ok(())
            }
            Command::Serve(a) => serve::serve(*a).await,
            Command::Dev(a) => dev::dev(a).await,
            Command::Jobs(a) => admin::jobs(a).await,
            Command::Token(a) => admin::tokens(a).await,
            Command::Reconcile(a) => admin::reconcile(*a).await,
            Command::Tenant(a) => crate::app::admin::tenant(a).await,
            Command::Doctor(a) => return admin::doctor(*a).await,
            Command::Plan(a) => admin::plan(*a).await,
        };
        done.map(|()| ExitCode::SUCCESS)
    });
    // the last spans go out before the process ends
    telemetry.shutdown();
    match result {
        Ok(code) => code,
        // `onramp jobs show 9 | head -1`: the reader has what it wanted
        Err(e) if output::is_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            match dev_world {
                // a dev that was killed leaves its settings behind: say where they came from
                Some(dir) => eprintln!("onramp: {e:#} (with the settings of the onramp dev in {})", dir.display()),
                None => eprintln!("onramp: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}
