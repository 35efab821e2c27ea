//! A fenced sink: the resource a leader writes to with its term, as a
//! database or a storage system guarded by a fencing token would be. It
//! refuses a write whose term is lower than the highest it accepted (a
//! stale leader: the fencing working as meant) and a write under the
//! highest term from another writer than the one that first used it: that
//! second kind is the broken promise, a term handed out twice.

use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct FencedSink {
    /// Who first wrote under each term.
    holders: HashMap<u64, String>,
    highest: u64,
    pub accepted: u64,
    /// Writes under a term below the highest accepted.
    pub stale: u64,
    /// Writes under a term another writer used first.
    pub duplicates: u64,
}

impl FencedSink {
    /// Offers a write by `writer` under `term`; returns whether it was
    /// accepted.
    pub fn write(&mut self, writer: &str, term: u64) -> bool {
        let first = self.holders.get(&term).cloned();
        if first.as_deref().is_some_and(|w| w != writer) {
            self.duplicates += 1;
            eprintln!(
                "fenced sink: term {term} from {writer}, first used by {}",
                first.unwrap_or_default()
            );
            return false;
        }
        if term < self.highest {
            self.stale += 1;
            return false;
        }
        self.holders
            .entry(term)
            .or_insert_with(|| writer.to_owned());
        self.highest = term;
        self.accepted += 1;
        true
    }

    /// How many terms it accepted writes under.
    pub fn terms(&self) -> usize {
        self.holders.len()
    }

    /// Who first wrote under `term`.
    pub fn holder(&self, term: u64) -> Option<&str> {
        self.holders.get(&term).map(String::as_str)
    }
}
