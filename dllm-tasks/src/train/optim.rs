//! AdamW (decoupled weight decay) with global-norm gradient clipping, whose state can be saved and
//! restored so a resumed run continues exactly.

use std::collections::HashMap;
use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use crate::{Error, Result};

/// Hyper-parameters.
#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay for matrices (norm weights and biases get none).
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (None: no clipping).
    pub clip_norm: Option<f64>,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            clip_norm: Some(1.0),
        }
    }
}

struct Slot {
    name: String,
    var: Var,
    m: Tensor,
    v: Tensor,
    decay: bool,
}

/// The optimizer.
pub struct AdamW {
    cfg: AdamWConfig,
    slots: Vec<Slot>,
    step: usize,
}

/// Linear warmup to `peak`, then cosine decay to `peak * min_ratio` at `total`.
pub fn lr_at(step: usize, total: usize, warmup: usize, peak: f64, min_ratio: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1);
    let progress = ((step - warmup) as f64 / span as f64).min(1.0);
    let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    peak * (min_ratio + (1.0 - min_ratio) * cos)
}

impl AdamW {
    /// Optimise `vars` (name, variable); 1-D variables (norms, biases) get no weight decay.
    pub fn new(vars: Vec<(String, Var)>, cfg: AdamWConfig) -> Result<Self> {
        let mut slots = Vec::with_capacity(vars.len());
        for (name, var) in vars {
            let decay = var.rank() >= 2;
            slots.push(Slot {
                m: var.zeros_like()?,
                v: var.zeros_like()?,
                name,
                var,
                decay,
            });
        }
        slots.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Self {
            cfg,
            slots,
            step: 0,
        })
    }

    /// Steps taken.
    pub fn steps(&self) -> usize {
        self.step
    }

    /// One update at learning rate `lr`; returns the global gradient norm before clipping.
    pub fn step(&mut self, grads: &GradStore, lr: f64) -> Result<f64> {
        let mut sq = 0f64;
        let mut gs = Vec::with_capacity(self.slots.len());
        for s in &self.slots {
            let g = match grads.get(s.var.as_tensor()) {
                Some(g) => g.clone(),
                None => s.var.zeros_like()?,
            };
            sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            gs.push(g);
        }
        let norm = sq.sqrt();
        if !norm.is_finite() {
            return Err(Error::Train(format!(
                "gradient norm is {norm}: training diverged"
            )));
        }
        let scale = match self.cfg.clip_norm {
            Some(c) if norm > c => c / norm,
            _ => 1.0,
        };
        self.step += 1;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let bc1 = 1.0 - b1.powi(self.step as i32);
        let bc2 = 1.0 - b2.powi(self.step as i32);
        for (s, g) in self.slots.iter_mut().zip(gs) {
            let g = (g * scale)?;
            s.m = ((&s.m * b1)? + (&g * (1.0 - b1))?)?;
            s.v = ((&s.v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let upd = ((&s.m / bc1)? / ((&s.v / bc2)?.sqrt()? + self.cfg.eps)?)?;
            let mut theta = s.var.as_tensor().clone();
            if s.decay && self.cfg.weight_decay > 0.0 {
                theta = (theta * (1.0 - lr * self.cfg.weight_decay))?;
            }
            s.var.set(&(theta - (upd * lr)?)?)?;
        }
        Ok(norm)
    }

    /// Save moments and the step count.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut map: HashMap<String, Tensor> = HashMap::new();
        for s in &self.slots {
            map.insert(format!("m.{}", s.name), s.m.clone());
            map.insert(format!("v.{}", s.name), s.v.clone());
        }
        map.insert(
            "step".into(),
            Tensor::new(&[self.step as u32], &candle_core::Device::Cpu)?,
        );
        candle_core::safetensors::save(&map, path)
            .map_err(|e| Error::Train(format!("{}: {e}", path.display())))
    }

    /// Restore what [`save`](Self::save) wrote (same variable names and shapes).
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let map = candle_core::safetensors::load(path, &candle_core::Device::Cpu)
            .map_err(|e| Error::Train(format!("{}: {e}", path.display())))?;
        let get = |k: &str| {
            map.get(k).cloned().ok_or_else(|| {
                Error::Train(format!("{}: optimizer state lacks `{k}`", path.display()))
            })
        };
        for s in &mut self.slots {
            let (m, v) = (
                get(&format!("m.{}", s.name))?,
                get(&format!("v.{}", s.name))?,
            );
            if m.dims() != s.var.dims() || v.dims() != s.var.dims() {
                return Err(Error::Train(format!(
                    "{}: optimizer state for `{}` has the wrong shape",
                    path.display(),
                    s.name
                )));
            }
            s.m = m;
            s.v = v;
        }
        self.step = get("step")?.to_vec1::<u32>()?[0] as usize;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_shape() {
        assert!((lr_at(0, 100, 10, 1.0, 0.1) - 0.1).abs() < 1e-12);
        assert!((lr_at(9, 100, 10, 1.0, 0.1) - 1.0).abs() < 1e-12);
        assert!((lr_at(10, 100, 10, 1.0, 0.1) - 1.0).abs() < 1e-12);
        assert!((lr_at(100, 100, 10, 1.0, 0.1) - 0.1).abs() < 1e-12);
        assert!(lr_at(55, 100, 10, 1.0, 0.1) < 0.6 && lr_at(55, 100, 10, 1.0, 0.1) > 0.5);
    }

    #[test]
    fn minimises_a_quadratic_and_clips() {
        let dev = candle_core::Device::Cpu;
        let x = Var::new(&[[3.0f32, -2.0]], &dev).unwrap();
        let mut opt = AdamW::new(
            vec![("x".into(), x.clone())],
            AdamWConfig {
                weight_decay: 0.0,
                ..Default::default()
            },
        )
        .unwrap();
        for _ in 0..300 {
            let loss = x.as_tensor().sqr().unwrap().sum_all().unwrap();
            let g = loss.backward().unwrap();
            let norm = opt.step(&g, 0.05).unwrap();
            assert!(norm.is_finite());
        }
        let v: Vec<f32> = x.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        assert!(v.iter().all(|a| a.abs() < 0.1), "{v:?}");
    }
}
