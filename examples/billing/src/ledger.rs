//! The payment provider this example charges through, reduced to what matters here: it accepts an
//! idempotency key with each charge (as Stripe, Adyen and most payment APIs do) and charges a key
//! once — a repeat gets the first charge's answer back. Its ledger is a file of one line per charge
//! (`key customer amount`), so it outlives the billing process and a test can read it.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Mutex;

/// What a charge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// The customer was charged now.
    Charged,
    /// This key was charged before: nothing was done again.
    AlreadyCharged,
}

/// A file-backed provider that charges each idempotency key once.
pub struct Provider {
    file: Mutex<(File, HashSet<String>)>,
}

impl Provider {
    /// Opens the ledger at `path` (created if missing) and loads the keys it holds.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).read(true).open(path)?;
        let mut keys = HashSet::new();
        for line in BufReader::new(&file).lines() {
            if let Some(key) = line?.split(' ').next() {
                keys.insert(key.to_owned());
            }
        }
        Ok(Self { file: Mutex::new((file, keys)) })
    }

    /// Charges `customer` `amount_cents` under `key`, unless `key` was charged before.
    pub fn charge(&self, key: &str, customer: &str, amount_cents: u64) -> std::io::Result<Charge> {
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let (file, keys) = &mut *guard;
        if keys.contains(key) {
            return Ok(Charge::AlreadyCharged);
        }
        // One write of the whole line: a killed process leaves whole lines.
        file.write_all(format!("{key} {customer} {amount_cents}\n").as_bytes())?;
        keys.insert(key.to_owned());
        Ok(Charge::Charged)
    }
}
