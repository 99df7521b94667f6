//! A ClickHouse server made ready for the sink: its version read, the configured
//! database and the four tables created if missing in the shape that version takes,
//! and an insert of one table's encoded rows. Tables that already exist keep their
//! shape: a server upgraded past [`super::version::CURRENT`] goes on receiving the
//! narrow rows its tables were created for.

use super::client::Client;
use super::schema::Table;
use super::version::{Shape, Version};
use super::Error;
use crate::config;

#[derive(Debug)]
pub struct Destination {
    client: Client,
    version: Version,
    shape: Shape,
}

impl Destination {
    /// Ask the server its version, then create the database and tables if missing.
    pub async fn open(settings: config::Sink) -> Result<Destination, Error> {
        let mut client = Client::new(settings)?;
        let version = client.version().await?;
        let create = create_database_sql(&client.settings().database);
        client.query_server(&create).await?;
        let shape = existing_shape(&mut client)
            .await?
            .unwrap_or(version.shape());
        // Only missing tables: 18.16 checks a CREATE's types even when the table
        // exists, so an IF NOT EXISTS alone would still fail there.
        let existing = client.query(TABLES_SQL).await?;
        let existing: Vec<&[u8]> = existing.split(|b| *b == b'\n').collect();
        for table in Table::ALL {
            if !existing.contains(&table.name().as_bytes()) {
                client.query(&table.create_sql(shape)).await?;
            }
        }
        Ok(Destination {
            client,
            version,
            shape,
        })
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Insert `rows` (RowBinary, encoded for [`Self::shape`]) into `table`. `token`
    /// names this batch's rows for this table; it must be the same each time the
    /// batch is re-sent, and is used where the server supports it.
    pub async fn insert(&mut self, table: Table, rows: Vec<u8>, token: &str) -> Result<(), Error> {
        if rows.is_empty() {
            return Ok(());
        }
        let settings = self.shape.insert_settings(token);
        self.client
            .insert(&table.insert_sql(self.shape), rows, &settings)
            .await
    }
}

/// Run outside any database, before anything else.
pub fn create_database_sql(database: &str) -> String {
    format!("CREATE DATABASE IF NOT EXISTS {database}")
}

/// The tables already in the database, one name a line.
pub const TABLES_SQL: &str = "SELECT name FROM system.tables WHERE database = currentDatabase()";

/// Which of the two columns that tell the shapes apart an `events` table has; its
/// answer (TabSeparated) is read by [`shape_of`].
pub const SHAPE_SQL: &str = "SELECT name FROM system.columns WHERE database = currentDatabase() \
     AND table = 'events' AND name IN ('uuid', 'timestamp_ms') ORDER BY name";

/// The shape of an `events` table already there, told by the narrow shape's own
/// column in the answer to [`SHAPE_SQL`]; None if there is no such table yet.
pub fn shape_of(columns: &[u8]) -> Option<Shape> {
    match columns {
        b"" => None,
        b"timestamp_ms\nuuid\n" => Some(Shape::Narrow),
        _ => Some(Shape::Current),
    }
}

async fn existing_shape(client: &mut Client) -> Result<Option<Shape>, Error> {
    Ok(shape_of(&client.query(SHAPE_SQL).await?))
}
