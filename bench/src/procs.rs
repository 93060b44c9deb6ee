//! The servers under test as child processes: started on loopback, stopped
//! (and waited for) on drop, with their CPU time read from /proc.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server process (and, for nginx, its workers) under measurement.
pub struct Server {
    child: Child,
}

impl Server {
    pub fn spawn(name: &str, command: &mut Command) -> Result<Self, String> {
        let child = command.spawn().map_err(|e| format!("starting {name}: {e}"))?;
        Ok(Self { child })
    }

    /// Starts `sluiced` (under `wrapper`, e.g. valgrind, when given) and
    /// waits for it to say where its control API is.
    pub fn sluiced(
        wrapper: &[String],
        binary: &Path,
        data_dir: &Path,
        io_mode: &str,
        extra: &[&str],
    ) -> Result<(Self, String), String> {
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let mut child = command
            .arg("--data-dir")
            .arg(data_dir)
            // Loopback only, so no grants: the suite measures the data path.
            .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--io-mode", io_mode, "--insecure"])
            .args(extra)
            .env("SLUICE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let endpoint = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(url) = line.strip_prefix("sluiced: control API on ") {
                        break url.trim().to_string();
                    }
                }
                _ => return Err("sluiced exited before announcing its control API".into()),
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Ok((Self { child }, endpoint))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU seconds (user + system) of the process and its children threads
    /// and worker processes so far.
    pub fn cpu_seconds(&self) -> f64 {
        let mut pids = vec![self.pid()];
        // nginx: the workers are children of the master.
        if let Ok(children) = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid())) {
            pids.extend(children.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
        pids.into_iter().map(cpu_seconds_of).sum()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM first so servers that write output on exit (callgrind) can.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// utime + stime of one process, in seconds.
pub fn cpu_seconds_of(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12].iter().filter_map(|i| fields.get(*i)?.parse::<u64>().ok()).sum();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100).max(1);
    ticks as f64 / per_second as f64
}

/// A free loopback TCP port.
pub fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// Waits until something accepts connections on `port`.
pub fn wait_port(port: u16, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("nothing listens on 127.0.0.1:{port}"))
}

/// Runs a command to completion; its stdout, or why it failed.
pub fn output(command: &mut Command) -> Result<String, String> {
    let out = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{command:?}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
