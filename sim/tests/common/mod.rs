//! What the integration tests share: a running `essim serve`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `essim serve`, killed when dropped.
pub struct Fleet {
    pub child: Child,
    pub urls: Vec<String>,
    pub dir: tempfile::TempDir,
}

impl Fleet {
    pub fn start(engines: usize, time_scale: f64) -> Fleet {
        Fleet::start_with(engines, time_scale, &[])
    }

    pub fn start_with(engines: usize, time_scale: f64, args: &[&str]) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_essim"))
            .args(["serve", "--listen-base", "127.0.0.1:0"])
            .args(args)
            .args(["--engines", &engines.to_string()])
            .args(["--time-scale", &time_scale.to_string()])
            .arg("--uri")
            .arg(format!("file://{}", dir.path().display()))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut urls = Vec::new();
        let mut fleet = Fleet {
            child,
            urls: Vec::new(),
            dir,
        };
        while urls.len() < engines {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("essim serve printed its engines");
            let (id, url) = line.split_once(' ').expect("`sim-<i> URL`");
            assert_eq!(id, format!("sim-{}", urls.len()));
            assert!(url.starts_with("http://127.0.0.1:"), "{url}");
            urls.push(url.to_owned());
        }
        fleet.urls = urls;
        fleet
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
