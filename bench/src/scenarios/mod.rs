//! The report's sections, one module each, in the order they run and print. Each takes the
//! shared [`Bench`], starts its own broker and appends its markdown to the report.

use crate::bench::Bench;

mod anchors;
mod cold;
mod exec;
mod fleet;
mod hostile;
mod memory;
mod refresh;
mod steady;
mod throughput;

/// One section of the report.
pub type Scenario = fn(&mut Bench<'_>);

/// Every section by its `--only` name, in report order.
pub const ALL: [(&str, Scenario); 9] = [
    ("exec", exec::run),
    ("throughput", throughput::run),
    ("cold", cold::run),
    ("memory", memory::run),
    ("refresh", refresh::run),
    ("fleet", fleet::run),
    ("steady", steady::run),
    ("hostile", hostile::run),
    ("anchors", anchors::run),
];
