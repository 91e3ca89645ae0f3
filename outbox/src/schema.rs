//! The outbox table: its schema, and the trigger that wakes the relay when rows are committed.
//!
//! | column | type | meaning |
//! |---|---|---|
//! | `id` | `bigserial` primary key | publication order; the record's `idempotency-key` header |
//! | `aggregate_key` | `text` not null | the Kafka key: rows of one key go to one partition, in id order |
//! | `topic` | `text` not null | the Kafka topic |
//! | `headers` | `jsonb` not null, default `{}` | record headers: an object of names to strings |
//! | `payload` | `bytea` | the record's value (`NULL`: a tombstone) |
//! | `created_at` | `timestamptz` not null, default `now()` | the record's timestamp |
//!
//! The trigger runs `pg_notify` once per inserting statement; PostgreSQL delivers notifications
//! only when the transaction commits, so a rolled-back insert wakes nobody (and its rows were never
//! visible).

use crate::{Error, RelayConfig};

/// The DDL for the table `config.table`, its trigger function and trigger (idempotent).
pub fn ddl(config: &RelayConfig) -> Result<String, Error> {
    config.validate()?;
    let table = &config.table;
    let function = format!("{}_notify", table);
    let trigger = format!("{}_notify", table.rsplit('.').next().unwrap_or(table));
    let channel = config.channel();
    Ok(format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    id            bigserial PRIMARY KEY,
    aggregate_key text NOT NULL,
    topic         text NOT NULL,
    headers       jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    payload       bytea,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{channel}', '');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS {trigger} ON {table};
CREATE TRIGGER {trigger} AFTER INSERT ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {function}();
"
    ))
}

/// Creates the table and its trigger in the database at `config.postgres_url` if they are missing.
pub async fn install(config: &RelayConfig) -> Result<(), Error> {
    let sql = ddl(config)?;
    let (client, connection) = tokio_postgres::connect(&config.postgres_url, tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(connection);
    let result = client.batch_execute(&sql).await;
    drop(client);
    let _ = driver.await;
    Ok(result?)
}
