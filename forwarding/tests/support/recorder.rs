//! A metrics recorder for one test: it keeps every counter's value and every histogram's
//! samples, by name and labels, so a test can read what the forwarder counted. (Written
//! here rather than taken from `metrics-util`'s debugging recorder, whose extra features
//! would change the build of the node that the workspace's other tests share.)

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// A metric's name and its labels, sorted.
type Id = (String, Vec<(String, String)>);

#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// Install with `metrics::with_local_recorder(&recording, ..)`, then read.
#[derive(Default)]
pub struct Recording {
    counters: Mutex<BTreeMap<Id, Arc<AtomicU64>>>,
    histograms: Mutex<BTreeMap<Id, Arc<Samples>>>,
}

fn id(key: &Key) -> Id {
    let mut labels: Vec<(String, String)> = key
        .labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect();
    labels.sort();
    (key.name().to_owned(), labels)
}

fn has_labels(id: &Id, name: &str, labels: &[(&str, &str)]) -> bool {
    id.0 == name
        && labels
            .iter()
            .all(|(k, v)| id.1.iter().any(|(lk, lv)| lk == k && lv == v))
}

/// The sum of `value` over the entries of `metrics` named `name` with every one of
/// `labels`; `None` if there is none.
fn sum_matching<T>(
    metrics: &BTreeMap<Id, Arc<T>>,
    name: &str,
    labels: &[(&str, &str)],
    value: impl Fn(&T) -> u64,
) -> Option<u64> {
    let mut matching = metrics
        .iter()
        .filter(|(id, _)| has_labels(id, name, labels))
        .peekable();
    matching.peek()?;
    Some(matching.map(|(_, metric)| value(metric)).sum())
}

impl Recording {
    /// The sum of the counters named `name` that carry every one of `labels`; `None` if
    /// no such counter was ever registered.
    pub fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        let counters = self.counters.lock().unwrap();
        sum_matching(&counters, name, labels, |c| c.load(Ordering::Relaxed))
    }

    /// How many samples the histograms named `name` with every one of `labels` hold;
    /// `None` if no such histogram was ever registered.
    pub fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Option<usize> {
        let histograms = self.histograms.lock().unwrap();
        sum_matching(&histograms, name, labels, |h| {
            h.0.lock().unwrap().len() as u64
        })
        .map(|n| n as usize)
    }
}

impl Recorder for Recording {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap();
        Counter::from_arc(counters.entry(id(key)).or_default().clone())
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut histograms = self.histograms.lock().unwrap();
        Histogram::from_arc(histograms.entry(id(key)).or_default().clone())
    }
}
