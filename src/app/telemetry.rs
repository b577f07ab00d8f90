//! Logs: text for people, JSON for collectors; the filter comes from `--log`.

use tracing_subscriber::EnvFilter;

use crate::app::cli::LogFormat;

pub fn init(filter: &str, format: LogFormat) -> Result<(), String> {
    let filter =
        EnvFilter::try_new(filter).map_err(|e| format!("invalid --log filter {filter:?} (ONRAMP_LOG): {e}"))?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let res = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    res.map_err(|e| format!("cannot set up logging: {e}"))
}
