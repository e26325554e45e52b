//! `bench`: the paper's evaluation (§5) on this project's models, by one command.

mod energy;
mod projection;

fn main() {
    let m = projection::PhoneModel::default();
    let (cpu, npu) = projection::paper_check(&m, 79);
    println!("projection check (prompt 79): CPU {cpu:.0} s (paper {}), NPU {npu:.0} s (paper {})",
        projection::PAPER_CPU_VANILLA_S, projection::PAPER_NPU_VANILLA_S);
    let _ = energy::PowerSource::find(std::path::Path::new("/sys/class/power_supply"));
}
