//! A transport that runs nothing: it records each command and answers with a canned reply. For
//! tests that check which argv a backend builds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backends::exec::{Command, Output, RunFuture, Transport};

/// Runs nothing: records each command and answers with a canned reply (success by default).
#[derive(Clone)]
pub struct Recorder {
    pub seen: Arc<Mutex<Vec<Command>>>,
    reply: Arc<dyn Fn(&Command) -> Output + Send + Sync>,
}

impl Recorder {
    pub fn new() -> Self {
        Self { seen: Arc::default(), reply: Arc::new(|_| Output::default()) }
    }
    pub fn replying(f: impl Fn(&Command) -> Output + Send + Sync + 'static) -> Self {
        Self { seen: Arc::default(), reply: Arc::new(f) }
    }
    pub fn commands(&self) -> Vec<Command> {
        self.seen.lock().expect("recorder lock").clone()
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Transport for Recorder {
    fn run<'a>(&'a self, cmd: &'a Command, _timeout: Duration) -> RunFuture<'a> {
        self.seen.lock().expect("recorder lock").push(cmd.clone());
        let out = (self.reply)(cmd);
        Box::pin(async move { Ok(out) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn recorder_records_and_replies() {
        let r = Recorder::replying(|c| Output { code: (c.argv()[0] == "fail") as i32, ..Default::default() });
        assert!(r.run(&Command::new("ok"), Duration::ZERO).await.unwrap().success());
        assert!(!r.run(&Command::new("fail"), Duration::ZERO).await.unwrap().success());
        assert_eq!(r.commands().len(), 2);
    }
}
