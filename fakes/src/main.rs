//! `onramp-fakes k8s|authentik [--listen ADDR] [--token TOKEN]`: one fake as a standalone
//! server. Prints its base URL on stdout's first line, then serves until killed. Drive it through
//! `/_fake/…` (see the crate's docs). Installed (symlinked) as `weka`, `lfs` or `lctl`, it is a
//! fake storage CLI instead (`onramp_fakes::storage_cli`).

use std::process::ExitCode;

use onramp_fakes::storage_cli;
use tokio::net::TcpListener;

const USAGE: &str = "usage: onramp-fakes k8s|authentik [--listen ADDR (127.0.0.1:0)] [--token TOKEN (authentik)]
  k8s        a Kubernetes API server (objects, server-side apply, exec running commands here)
  authentik  Authentik's /api/v3/core users and groups, checking `Authorization: Bearer TOKEN`
Prints the URL on stdout's first line; control API under /_fake/.
Symlinked as weka, lfs or lctl: a fake storage CLI that keeps its state beside the link.";

struct Args {
    which: String,
    listen: String,
    token: String,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let which = it.next().ok_or("which fake?")?;
    if which == "-h" || which == "--help" {
        return Err(String::new());
    }
    let mut a = Args { which, listen: "127.0.0.1:0".into(), token: onramp_fakes::authentik::TOKEN.into() };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => a.listen = value()?,
            "--token" => a.token = value()?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let argv0 = std::env::args().next().unwrap_or_default();
    let prog = std::path::Path::new(&argv0).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if storage_cli::NAMES.contains(&prog) {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let out = storage_cli::run(&storage_cli::installed_in(&argv0), prog, &args);
        print!("{}", out.stdout);
        eprint!("{}", out.stderr);
        return ExitCode::from(out.code);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    rt.block_on(serve())
}

async fn serve() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("onramp-fakes: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let listener = match TcpListener::bind(&a.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("onramp-fakes: cannot listen on {}: {e}", a.listen);
            return ExitCode::FAILURE;
        }
    };
    let url = match a.which.as_str() {
        "k8s" => onramp_fakes::k8s::FakeK8s::serve(listener).url,
        "authentik" => onramp_fakes::authentik::serve(listener, &a.token).1,
        other => {
            eprintln!("onramp-fakes: no fake named {other}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    println!("{url}");
    let _ = tokio::signal::ctrl_c().await;
    ExitCode::SUCCESS
}
