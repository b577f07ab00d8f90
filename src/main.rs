//! onramp's command line; everything else lives in the library.

fn main() -> std::process::ExitCode {
    let cli = onramp::cli::parse();
    onramp::run(cli)
}
