//! onramp's command line; everything else lives in the library.

fn main() -> std::process::ExitCode {
    let cli = onramp::app::cli::parse();
    onramp::app::run(cli)
}
