//! An owned reply, for tests, fuzzing and callers that keep replies past the buffer.

use super::decode::Reply;
use super::encode::line;

/// An owned RESP2 value: what a [`Reply`] borrows, copied out.
///
/// # Example
///
/// ```
/// use quorumlock::__private::resp::{decode, Limits, Value};
///
/// let (reply, _) = decode(b"*2\r\n:1\r\n$-1\r\n", &Limits::default()).unwrap().unwrap();
/// let value = Value::from_reply(&reply);
/// assert_eq!(value, Value::Array(Some(vec![Value::Integer(1), Value::Bulk(None)])));
/// let mut wire = Vec::new();
/// value.encode(&mut wire);
/// assert_eq!(wire, b"*2\r\n:1\r\n$-1\r\n");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// `+...`
    Simple(Vec<u8>),
    /// `-...`
    Error(Vec<u8>),
    /// `:...`
    Integer(i64),
    /// `$...`, `None` for null.
    Bulk(Option<Vec<u8>>),
    /// `*...`, `None` for null.
    Array(Option<Vec<Value>>),
}

impl Value {
    /// Copies a borrowed reply. Recursion is bounded by the depth limit the reply was
    /// parsed under (at most [`super::MAX_DEPTH`]).
    pub fn from_reply(reply: &Reply<'_>) -> Value {
        match *reply {
            Reply::Simple(s) => Value::Simple(s.to_vec()),
            Reply::Error(s) => Value::Error(s.to_vec()),
            Reply::Integer(i) => Value::Integer(i),
            Reply::Bulk(b) => Value::Bulk(b.map(<[u8]>::to_vec)),
            Reply::Array(a) => {
                Value::Array(a.map(|a| a.iter().map(|r| Value::from_reply(&r)).collect()))
            }
        }
    }

    /// Appends the wire form of this value as a server would send it. Simple strings and
    /// errors must not contain `\r` or `\n` for the result to parse back the same.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Simple(s) | Value::Error(s) => {
                out.push(if matches!(self, Value::Simple(_)) {
                    b'+'
                } else {
                    b'-'
                });
                out.extend_from_slice(s);
                out.extend_from_slice(b"\r\n");
            }
            Value::Integer(i) => line(out, b':', i.unsigned_abs(), *i < 0),
            Value::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Value::Bulk(Some(b)) => super::encode::bulk(out, b),
            Value::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Value::Array(Some(items)) => {
                super::encode::array(out, items.len());
                for item in items {
                    item.encode(out);
                }
            }
        }
    }
}
