//! A small decoder for the pgoutput messages the relay needs (protocol version 1, streaming
//! off): Relation and Insert. Begin, Commit and logical Messages are already parsed by
//! `pgwire-replication`; everything else (Type, Origin, Update, Delete, Truncate) is passed
//! over as [`PgOutput::Other`].
//!
//! Streaming stays off on purpose: with `streaming` on, Postgres sends the rows of large
//! in-progress transactions before they commit, including ones later rolled back, and an
//! Announcement for a rolled-back Delivery must never reach Kafka.
//!
//! The decoder never panics, whatever the bytes: every read is bounds-checked and a short or
//! malformed message is a [`DecodeError`] (property-tested below).

use std::collections::HashMap;

/// One pgoutput message, as far as the relay cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgOutput {
    Relation(Relation),
    Insert {
        relation_id: u32,
        tuple: Vec<Column>,
    },
    Other(u8),
}

/// A table's shape, sent before its first row in a session (and again after DDL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    pub columns: Vec<String>,
}

/// One column value of a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Column {
    Null,
    /// A TOASTed value that did not change (never for an insert, but legal on the wire).
    Unchanged,
    Text(String),
    Binary(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("pgoutput message ends early")]
    Truncated,
    #[error("pgoutput message is empty")]
    Empty,
    #[error("pgoutput string is not UTF-8")]
    NotUtf8,
    #[error("unknown tuple column kind {0:#x}")]
    UnknownColumnKind(u8),
    #[error("insert tuple marker {0:#x} is not 'N'")]
    BadTupleMarker(u8),
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A NUL-terminated string.
    fn cstring(&mut self) -> Result<String, DecodeError> {
        let end = self
            .buf
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::Truncated)?;
        let s = std::str::from_utf8(&self.buf[..end]).map_err(|_| DecodeError::NotUtf8)?;
        self.buf = &self.buf[end + 1..];
        Ok(s.to_owned())
    }
}

pub fn decode(data: &[u8]) -> Result<PgOutput, DecodeError> {
    let (&tag, rest) = data.split_first().ok_or(DecodeError::Empty)?;
    let mut r = Reader { buf: rest };
    match tag {
        b'R' => decode_relation(&mut r).map(PgOutput::Relation),
        b'I' => {
            let relation_id = r.u32()?;
            let marker = r.u8()?;
            if marker != b'N' {
                return Err(DecodeError::BadTupleMarker(marker));
            }
            let tuple = decode_tuple(&mut r)?;
            Ok(PgOutput::Insert { relation_id, tuple })
        }
        other => Ok(PgOutput::Other(other)),
    }
}

fn decode_relation(r: &mut Reader<'_>) -> Result<Relation, DecodeError> {
    let id = r.u32()?;
    let namespace = r.cstring()?;
    let name = r.cstring()?;
    let _replica_identity = r.u8()?;
    let count = r.u16()?;
    let mut columns = Vec::with_capacity(usize::from(count).min(r.buf.len()));
    for _ in 0..count {
        let _flags = r.u8()?;
        columns.push(r.cstring()?);
        let _type_oid = r.u32()?;
        let _type_modifier = r.u32()?;
    }
    Ok(Relation {
        id,
        namespace,
        name,
        columns,
    })
}

fn decode_tuple(r: &mut Reader<'_>) -> Result<Vec<Column>, DecodeError> {
    let count = r.u16()?;
    let mut columns = Vec::with_capacity(usize::from(count).min(r.buf.len()));
    for _ in 0..count {
        let column = match r.u8()? {
            b'n' => Column::Null,
            b'u' => Column::Unchanged,
            kind @ (b't' | b'b') => {
                let len = r.u32()? as usize;
                let bytes = r.take(len)?;
                if kind == b't' {
                    let text = std::str::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8)?;
                    Column::Text(text.to_owned())
                } else {
                    Column::Binary(bytes.to_vec())
                }
            }
            other => return Err(DecodeError::UnknownColumnKind(other)),
        };
        columns.push(column);
    }
    Ok(columns)
}

/// A decoded row by column name.
pub fn named<'a>(relation: &'a Relation, tuple: &'a [Column]) -> HashMap<&'a str, &'a Column> {
    relation
        .columns
        .iter()
        .map(String::as_str)
        .zip(tuple.iter())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation_bytes() -> Vec<u8> {
        let mut b = vec![b'R'];
        b.extend(16384u32.to_be_bytes());
        b.extend(b"public\0outbox\0");
        b.push(b'd');
        b.extend(2u16.to_be_bytes());
        for name in ["id", "reason"] {
            b.push(1);
            b.extend(name.as_bytes());
            b.push(0);
            b.extend(25u32.to_be_bytes());
            b.extend((-1i32).to_be_bytes());
        }
        b
    }

    #[test]
    fn decodes_relation_and_insert() {
        let rel = match decode(&relation_bytes()).expect("relation") {
            PgOutput::Relation(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(rel.name, "outbox");
        assert_eq!(rel.columns, vec!["id", "reason"]);

        let mut insert = vec![b'I'];
        insert.extend(16384u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(2u16.to_be_bytes());
        insert.push(b't');
        insert.extend(2u32.to_be_bytes());
        insert.extend(b"42");
        insert.push(b'n');
        let PgOutput::Insert { relation_id, tuple } = decode(&insert).expect("insert") else {
            panic!("not an insert");
        };
        assert_eq!(relation_id, 16384);
        let row = named(&rel, &tuple);
        assert_eq!(row["id"], &Column::Text("42".into()));
        assert_eq!(row["reason"], &Column::Null);
    }

    /// An insert whose two columns come as `kind` (and, for `t`/`b`, `value`).
    fn insert_of(columns: &[(u8, &[u8])]) -> Vec<u8> {
        let mut insert = vec![b'I'];
        insert.extend(16384u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(u16::try_from(columns.len()).expect("few").to_be_bytes());
        for (kind, value) in columns {
            insert.push(*kind);
            if matches!(kind, b't' | b'b') {
                insert.extend(u32::try_from(value.len()).expect("short").to_be_bytes());
                insert.extend(*value);
            }
        }
        insert
    }

    #[test]
    fn unchanged_toast_and_binary_columns_decode_as_such() {
        // 'u': a TOASTed value the server did not send (updates only, but the decoder must
        // not misread what follows it); 'b': a value in binary format.
        let bytes = insert_of(&[(b'u', b""), (b'b', &[0, 1, 0xff])]);
        let PgOutput::Insert { tuple, .. } = decode(&bytes).expect("insert") else {
            panic!("not an insert");
        };
        assert_eq!(
            tuple,
            vec![Column::Unchanged, Column::Binary(vec![0, 1, 0xff])]
        );
        // The column after a 'u' is read from the right offset.
        let bytes = insert_of(&[(b'u', b""), (b't', b"7")]);
        let PgOutput::Insert { tuple, .. } = decode(&bytes).expect("insert") else {
            panic!("not an insert");
        };
        assert_eq!(tuple, vec![Column::Unchanged, Column::Text("7".into())]);
        // A binary value is never taken for text: the Announcement needs text columns.
        let rel = match decode(&relation_bytes()).expect("relation") {
            PgOutput::Relation(r) => r,
            other => panic!("{other:?}"),
        };
        let bytes = insert_of(&[(b'b', b"42"), (b'n', b"")]);
        let PgOutput::Insert { tuple, .. } = decode(&bytes).expect("insert") else {
            panic!("not an insert");
        };
        assert_eq!(named(&rel, &tuple)["id"], &Column::Binary(b"42".to_vec()));
        // An unknown kind is an error, not a guess.
        assert!(decode(&insert_of(&[(b'x', b"")])).is_err());
    }

    #[test]
    fn short_messages_are_errors() {
        let full = relation_bytes();
        for cut in 0..full.len() {
            assert!(decode(&full[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(decode(b"Yxyz"), Ok(PgOutput::Other(b'Y')));
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn never_panics_on_arbitrary_inserts(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut bytes = vec![b'I'];
            bytes.extend(body);
            let _ = decode(&bytes);
        }
    }
}
