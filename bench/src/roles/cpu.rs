//! What each process of a roles run costs in CPU: the three roles by pid, and the broker,
//! Postgres and Redis found by their process names.

use std::time::Duration;

/// Pids whose command name (`/proc/<pid>/comm`) is one of `names`.
fn processes_named(names: &[&str]) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| names.contains(&c.trim()))
        })
        .collect()
}

/// CPU seconds used so far by all of `pids` together.
fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|p| crate::stats::process_usage(*p))
        .map(|(cpu, _)| cpu)
        .sum()
}

/// Every process the bench accounts for: the three roles, and the broker, Postgres and Redis
/// found by their process names (every one on the machine: run nothing else beside the
/// bench). Postgres' backends come and go, so they are looked up again at each reading.
pub(crate) struct Groups {
    roles: Vec<(String, Vec<u32>)>,
    /// Further processes by name (a receiver's broker), each group with its label.
    named: Vec<(String, Vec<&'static str>)>,
}

impl Groups {
    pub(crate) fn new(roles: &[(&'static str, u32)]) -> Self {
        Self {
            roles: roles
                .iter()
                .map(|(name, pid)| ((*name).to_owned(), vec![*pid]))
                .collect(),
            named: Vec::new(),
        }
    }

    /// Also counts the processes named `names`, as one group labelled `label`.
    pub(crate) fn with_named(mut self, label: &str, names: &[&'static str]) -> Self {
        self.named.push((label.to_owned(), names.to_vec()));
        self
    }

    /// (name, CPU seconds used so far) per group.
    pub(crate) fn read(&self) -> Vec<(String, f64)> {
        let mut groups = self.roles.clone();
        groups.push((
            "broker (tansu, nisshi)".into(),
            processes_named(&["tansu", "nisshi"]),
        ));
        groups.push((
            "Postgres (every backend)".into(),
            processes_named(&["postgres"]),
        ));
        groups.push(("Redis".into(), processes_named(&["redis-server"])));
        for (label, names) in &self.named {
            groups.push((label.clone(), processes_named(names)));
        }
        groups
            .into_iter()
            .map(|(name, pids)| (name, cpu_of(&pids)))
            .collect()
    }
}

/// CPU seconds each group used between two readings. A backend that ended in between took
/// its seconds with it, so Postgres' figure is a lower bound.
pub(crate) fn used(before: &[(String, f64)], after: &[(String, f64)]) -> Vec<(String, f64)> {
    after
        .iter()
        .zip(before)
        .map(|((name, a), (_, b))| (name.clone(), (a - b).max(0.0)))
        .collect()
}

/// Every process's CPU while nothing is sent, as % of one core: what an idle Railhook costs
/// itself and the services it talks to.
pub(crate) async fn idle(groups: &Groups, settle: Duration, window: Duration) {
    let before = groups.read();
    eprintln!("roles: idle for {} s", window.as_secs());
    tokio::time::sleep(window).await;
    println!(
        "## Idle for {} s, from {} s after the warm-up: CPU as % of one core\n\n| process | % of a core |\n| --- | ---: |",
        window.as_secs(),
        settle.as_secs()
    );
    for (name, cpu) in used(&before, &groups.read()) {
        println!("| {name} | {:.1} % |", 100.0 * cpu / window.as_secs_f64());
    }
    println!();
}
