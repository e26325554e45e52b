//! Battery power sampling (paper §5.1, §5.7): a thread reads `/sys/class/power_supply/*` at a fixed
//! rate — `power_now` (µW), or `current_now` (µA) × `voltage_now` (µV) — and integrates the energy
//! of a request minus the idle power measured before it.
//!
//! Where no battery exists (these build machines, most servers) every function says so with
//! [`Energy::Unavailable`] instead of inventing a number; the sampler is tested against a fake
//! sysfs tree.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where power readings come from.
#[derive(Debug, Clone, PartialEq)]
pub enum PowerSource {
    /// `<supply>/power_now` in µW.
    PowerNow(PathBuf),
    /// `<supply>/current_now` (µA) × `<supply>/voltage_now` (µV).
    CurrentVoltage(PathBuf),
}

impl PowerSource {
    /// The first battery under `root` (normally `/sys/class/power_supply`) that reports power, if any.
    pub fn find(root: &Path) -> Option<PowerSource> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        dirs.sort();
        for d in dirs {
            let kind = std::fs::read_to_string(d.join("type")).unwrap_or_default();
            if kind.trim() != "Battery" {
                continue;
            }
            if read_num(&d.join("power_now")).is_some() {
                return Some(PowerSource::PowerNow(d));
            }
            if read_num(&d.join("current_now")).is_some()
                && read_num(&d.join("voltage_now")).is_some()
            {
                return Some(PowerSource::CurrentVoltage(d));
            }
        }
        None
    }

    /// One reading in watts (discharge power: the magnitude, whatever the sign convention).
    pub fn watts(&self) -> Option<f64> {
        match self {
            PowerSource::PowerNow(d) => read_num(&d.join("power_now")).map(|uw| uw.abs() / 1e6),
            PowerSource::CurrentVoltage(d) => {
                let i = read_num(&d.join("current_now"))?;
                let v = read_num(&d.join("voltage_now"))?;
                Some((i * v).abs() / 1e12)
            }
        }
    }
}

fn read_num(p: &Path) -> Option<f64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Energy of a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Energy {
    /// No battery power reading on this machine.
    Unavailable,
    /// Measured.
    Measured {
        /// Mean power during the request, W.
        mean_watts: f64,
        /// Idle power subtracted, W.
        idle_watts: f64,
        /// Idle-subtracted energy of the request, J.
        joules: f64,
        /// Samples taken.
        samples: usize,
    },
}

/// Samples power on its own thread from `start` until `stop`.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(Instant, f64)>>>,
    thread: Option<JoinHandle<()>>,
    started: Instant,
}

impl Sampler {
    /// Start sampling `source` every `period`.
    pub fn start(source: PowerSource, period: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (s2, v2) = (stop.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                if let Some(w) = source.watts() {
                    v2.lock().expect("sampler lock").push((Instant::now(), w));
                }
                std::thread::sleep(period);
            }
        });
        Sampler {
            stop,
            samples,
            thread: Some(thread),
            started: Instant::now(),
        }
    }

    /// Stop and return the energy above `idle_watts` (trapezoidal integration of the samples).
    pub fn finish(mut self, idle_watts: f64) -> Energy {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let s = self.samples.lock().expect("sampler lock").clone();
        integrate(&s, self.started, idle_watts)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Idle-subtracted energy of timestamped power samples.
pub fn integrate(samples: &[(Instant, f64)], start: Instant, idle_watts: f64) -> Energy {
    if samples.is_empty() {
        return Energy::Unavailable;
    }
    let mut joules = 0.0;
    let mut prev = (start, samples[0].1);
    for &(t, w) in samples {
        let dt = t.saturating_duration_since(prev.0).as_secs_f64();
        joules += dt * ((w + prev.1) / 2.0 - idle_watts);
        prev = (t, w);
    }
    let mean = samples.iter().map(|s| s.1).sum::<f64>() / samples.len() as f64;
    Energy::Measured {
        mean_watts: mean,
        idle_watts,
        joules: joules.max(0.0),
        samples: samples.len(),
    }
}

/// Mean power over `window` with nothing running (the idle baseline), or `None` without a battery.
pub fn idle_watts(source: &PowerSource, window: Duration, period: Duration) -> Option<f64> {
    let end = Instant::now() + window;
    let mut v = Vec::new();
    while Instant::now() < end {
        if let Some(w) = source.watts() {
            v.push(w);
        }
        std::thread::sleep(period);
    }
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(root: &Path, name: &str, files: &[(&str, &str)]) {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in files {
            std::fs::write(d.join(f), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn finds_a_battery_in_a_fake_sysfs_tree_and_reads_watts() {
        let root = std::env::temp_dir().join(format!("fake-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        fake(&root, "AC", &[("type", "Mains"), ("online", "1")]);
        assert_eq!(PowerSource::find(&root), None, "mains only: unavailable");
        fake(
            &root,
            "battery",
            &[
                ("type", "Battery"),
                ("current_now", "-500000"),
                ("voltage_now", "4000000"),
            ],
        );
        let src = PowerSource::find(&root).unwrap();
        assert!(matches!(src, PowerSource::CurrentVoltage(_)));
        assert!((src.watts().unwrap() - 2.0).abs() < 1e-12); // 0.5 A x 4 V
        fake(&root, "battery", &[("power_now", "3500000")]);
        let src = PowerSource::find(&root).unwrap();
        assert!(matches!(src, PowerSource::PowerNow(_)));
        assert!((src.watts().unwrap() - 3.5).abs() < 1e-12);
        // A sampler over the fake file: constant 3.5 W, 1 W idle.
        let s = Sampler::start(src.clone(), Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(60));
        match s.finish(1.0) {
            Energy::Measured {
                mean_watts,
                joules,
                samples,
                ..
            } => {
                assert!(samples >= 3, "{samples}");
                assert!((mean_watts - 3.5).abs() < 1e-9);
                // About 2.5 W above idle for ~60 ms.
                assert!(joules > 0.05 && joules < 0.5, "{joules}");
            }
            Energy::Unavailable => panic!("the fake battery was not sampled"),
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn no_samples_is_unavailable_and_integration_is_exact() {
        let t0 = Instant::now();
        assert_eq!(integrate(&[], t0, 0.0), Energy::Unavailable);
        let s = [
            (t0 + Duration::from_secs(1), 2.0),
            (t0 + Duration::from_secs(3), 4.0),
        ];
        match integrate(&s, t0, 1.0) {
            Energy::Measured { joules, .. } => {
                assert!((joules - (1.0 * 1.0 + 2.0 * 2.0)).abs() < 1e-9)
            }
            e => panic!("{e:?}"),
        }
        assert_eq!(
            PowerSource::find(Path::new("/nonexistent/power_supply")),
            None
        );
    }
}
