//! A ClickHouse server made ready for the sink: its version read, the configured
//! database and the four tables created if missing in the shape that version takes,
//! and an insert of one table's encoded rows.

use super::client::Client;
use super::schema::Table;
use super::version::{Shape, Version};
use super::{Error, Settings};

#[derive(Debug)]
pub struct Destination {
    client: Client,
    version: Version,
    shape: Shape,
}

impl Destination {
    /// Ask the server its version, then create the database and tables if missing.
    pub async fn open(settings: Settings) -> Result<Destination, Error> {
        let mut client = Client::new(settings)?;
        let version = client.version().await?;
        let shape = version.shape();
        let create = format!(
            "CREATE DATABASE IF NOT EXISTS {}",
            client.settings().database
        );
        client.query_server(&create).await?;
        for table in Table::ALL {
            client.query(&table.create_sql(shape)).await?;
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
        let token = self.shape.dedup_token().then_some(token);
        self.client
            .insert(&table.insert_sql(self.shape), rows, token)
            .await
    }
}
