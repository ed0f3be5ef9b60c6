//! A QMP client: one command at a time over QEMU's `-qmp
//! unix:PATH,server=on,wait=off` socket, asynchronous events skipped.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long one reply may take before the monitor counts as hung.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong with a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QmpError {
    /// The socket failed, closed, timed out or carried something that is
    /// not QMP's JSON.
    Transport(String),
    /// QEMU answered `{"error": {"class": ..., "desc": ...}}`.
    Command {
        /// `error.class`.
        class: String,
        /// `error.desc`.
        desc: String,
    },
}

impl fmt::Display for QmpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QmpError::Transport(why) => write!(f, "QMP transport: {why}"),
            QmpError::Command { class, desc } => write!(f, "QMP error {class}: {desc}"),
        }
    }
}

/// A connected monitor in command mode (`qmp_capabilities` done).
#[derive(Debug)]
pub struct Qmp {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
    events: Vec<Value>,
}

impl Qmp {
    /// Connect to the socket at `path` (retrying until `within` has
    /// passed: QEMU creates it while starting), read the greeting and
    /// leave capabilities negotiation.
    pub fn connect(path: &Path, within: Duration) -> Result<Qmp, QmpError> {
        let deadline = Instant::now() + within;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(QmpError::Transport(format!(
                        "connecting to {}: {e}",
                        path.display()
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let io = |e: std::io::Error| QmpError::Transport(e.to_string());
        stream.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
        let reader = BufReader::new(stream.try_clone().map_err(io)?);
        let mut qmp = Qmp {
            writer: stream,
            reader,
            events: Vec::new(),
        };
        let greeting = qmp.next_message()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError::Transport(format!("no greeting: {greeting}")));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// Run `command` (with `arguments`, an object, if any) and return its
    /// `return` value. Events that arrive meanwhile are kept ([`Qmp::take_events`]).
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let mut cmd = json!({ "execute": command });
        if let Some(a) = arguments {
            cmd["arguments"] = a;
        }
        writeln!(self.writer, "{cmd}")
            .map_err(|e| QmpError::Transport(format!("sending {command}: {e}")))?;
        loop {
            let mut v = self.next_message()?;
            if v.get("event").is_some() {
                self.events.push(v);
                continue;
            }
            if let Some(r) = v.get_mut("return") {
                return Ok(r.take());
            }
            if let Some(e) = v.get("error") {
                let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
                return Err(QmpError::Command {
                    class: text("class"),
                    desc: text("desc"),
                });
            }
            return Err(QmpError::Transport(format!(
                "{command}: neither return nor error: {v}"
            )));
        }
    }

    /// HMP `command_line` through `human-monitor-command`: its text.
    pub fn hmp(&mut self, command_line: &str) -> Result<String, QmpError> {
        let r = self.execute(
            "human-monitor-command",
            Some(json!({ "command-line": command_line })),
        )?;
        Ok(r.as_str().unwrap_or_default().to_string())
    }

    /// The events received since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.events)
    }

    fn next_message(&mut self) -> Result<Value, QmpError> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(QmpError::Transport("the monitor closed".to_string())),
            Ok(_) => serde_json::from_str(&line)
                .map_err(|e| QmpError::Transport(format!("not JSON ({e}): {line:?}"))),
            Err(e) => Err(QmpError::Transport(format!("reading a reply: {e}"))),
        }
    }
}
