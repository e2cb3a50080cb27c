//! A value's `Serialize` made into Python objects: `EngineState.to_dict` is
//! built by the `Serialize` that makes `esdump --json` (`reader/src/state.rs`),
//! straight into a `dict`, same keys in the same order, no JSON text in
//! between. Only what that serialisation uses is supported: one map of
//! string keys to integers, floats, strings, `None` and unit variants.

use std::fmt::Display;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3::BoundObject;
use serde::ser::{self, Impossible, Serialize, SerializeMap};

/// `value` (serialised as a map) as a Python `dict`.
pub(crate) fn to_dict<'py, T: Serialize>(
    py: Python<'py>,
    value: &T,
) -> PyResult<Bound<'py, PyDict>> {
    value
        .serialize(DictSerializer { py })
        .map_err(|e| PyValueError::new_err(e.0))
}

/// Why a value could not be made into Python objects.
#[derive(Debug)]
pub(crate) struct Error(String);

impl Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<M: Display>(msg: M) -> Error {
        Error(msg.to_string())
    }
}

impl From<PyErr> for Error {
    fn from(err: PyErr) -> Error {
        Error(err.to_string())
    }
}

fn unsupported<T>(what: &str) -> Result<T, Error> {
    Err(Error(format!("to_dict: {what} is not supported")))
}

/// Serialises the top-level map into a `dict`.
struct DictSerializer<'py> {
    py: Python<'py>,
}

/// The `dict` being filled, and the key waiting for its value.
struct DictMap<'py> {
    dict: Bound<'py, PyDict>,
    key: Option<Bound<'py, PyAny>>,
}

impl<'py> SerializeMap for DictMap<'py> {
    type Ok = Bound<'py, PyDict>;
    type Error = Error;

    fn serialize_key<K: ?Sized + Serialize>(&mut self, key: &K) -> Result<(), Error> {
        self.key = Some(key.serialize(ValueSerializer { py: self.dict.py() })?);
        Ok(())
    }

    fn serialize_value<V: ?Sized + Serialize>(&mut self, value: &V) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Error("a value without a key".into()))?;
        let value = value.serialize(ValueSerializer { py: self.dict.py() })?;
        self.dict.set_item(key, value)?;
        Ok(())
    }

    fn end(self) -> Result<Bound<'py, PyDict>, Error> {
        Ok(self.dict)
    }
}

/// Serialises one value into a Python object.
struct ValueSerializer<'py> {
    py: Python<'py>,
}

impl<'py> ValueSerializer<'py> {
    fn object<T>(self, value: T) -> Result<Bound<'py, PyAny>, Error>
    where
        T: IntoPyObject<'py>,
        PyErr: From<T::Error>,
    {
        let object = value.into_pyobject(self.py).map_err(PyErr::from)?;
        Ok(object.into_any().into_bound())
    }
}

/// The serializer methods no value of an `EngineState` needs.
macro_rules! unsupported_methods {
    ($($method:ident($($arg:ty),*) -> $ok:ty;)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<$ok, Error> {
            unsupported(stringify!($method))
        })*
    };
}

impl<'py> ser::Serializer for DictSerializer<'py> {
    type Ok = Bound<'py, PyDict>;
    type Error = Error;
    type SerializeSeq = Impossible<Self::Ok, Error>;
    type SerializeTuple = Impossible<Self::Ok, Error>;
    type SerializeTupleStruct = Impossible<Self::Ok, Error>;
    type SerializeTupleVariant = Impossible<Self::Ok, Error>;
    type SerializeMap = DictMap<'py>;
    type SerializeStruct = Impossible<Self::Ok, Error>;
    type SerializeStructVariant = Impossible<Self::Ok, Error>;

    fn serialize_map(self, _len: Option<usize>) -> Result<DictMap<'py>, Error> {
        Ok(DictMap {
            dict: PyDict::new(self.py),
            key: None,
        })
    }

    unsupported_methods! {
        serialize_bool(bool) -> Self::Ok;
        serialize_i8(i8) -> Self::Ok;
        serialize_i16(i16) -> Self::Ok;
        serialize_i32(i32) -> Self::Ok;
        serialize_i64(i64) -> Self::Ok;
        serialize_u8(u8) -> Self::Ok;
        serialize_u16(u16) -> Self::Ok;
        serialize_u32(u32) -> Self::Ok;
        serialize_u64(u64) -> Self::Ok;
        serialize_f32(f32) -> Self::Ok;
        serialize_f64(f64) -> Self::Ok;
        serialize_char(char) -> Self::Ok;
        serialize_str(&str) -> Self::Ok;
        serialize_bytes(&[u8]) -> Self::Ok;
        serialize_none() -> Self::Ok;
        serialize_unit() -> Self::Ok;
        serialize_unit_struct(&'static str) -> Self::Ok;
        serialize_unit_variant(&'static str, u32, &'static str) -> Self::Ok;
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_struct(&'static str, usize) -> Self::SerializeStruct;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<Self::Ok, Error> {
        unsupported("serialize_some")
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, Error> {
        unsupported("serialize_newtype_struct")
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, Error> {
        unsupported("serialize_newtype_variant")
    }
}

impl<'py> ser::Serializer for ValueSerializer<'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Error;
    type SerializeSeq = Impossible<Self::Ok, Error>;
    type SerializeTuple = Impossible<Self::Ok, Error>;
    type SerializeTupleStruct = Impossible<Self::Ok, Error>;
    type SerializeTupleVariant = Impossible<Self::Ok, Error>;
    type SerializeMap = Impossible<Self::Ok, Error>;
    type SerializeStruct = Impossible<Self::Ok, Error>;
    type SerializeStructVariant = Impossible<Self::Ok, Error>;

    fn serialize_bool(self, v: bool) -> Result<Self::Ok, Error> {
        Ok(v.into_pyobject(self.py)
            .map_err(PyErr::from)?
            .to_owned()
            .into_any())
    }

    fn serialize_i64(self, v: i64) -> Result<Self::Ok, Error> {
        self.object(v)
    }

    fn serialize_i8(self, v: i8) -> Result<Self::Ok, Error> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i16(self, v: i16) -> Result<Self::Ok, Error> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_i32(self, v: i32) -> Result<Self::Ok, Error> {
        self.serialize_i64(i64::from(v))
    }

    fn serialize_u64(self, v: u64) -> Result<Self::Ok, Error> {
        self.object(v)
    }

    fn serialize_u8(self, v: u8) -> Result<Self::Ok, Error> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u16(self, v: u16) -> Result<Self::Ok, Error> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_u32(self, v: u32) -> Result<Self::Ok, Error> {
        self.serialize_u64(u64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<Self::Ok, Error> {
        self.object(v)
    }

    fn serialize_f32(self, v: f32) -> Result<Self::Ok, Error> {
        self.serialize_f64(f64::from(v))
    }

    fn serialize_str(self, v: &str) -> Result<Self::Ok, Error> {
        self.object(v)
    }

    fn serialize_none(self) -> Result<Self::Ok, Error> {
        Ok(self.py.None().into_bound(self.py))
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<Self::Ok, Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<Self::Ok, Error> {
        self.serialize_none()
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<Self::Ok, Error> {
        self.serialize_str(variant)
    }

    unsupported_methods! {
        serialize_char(char) -> Self::Ok;
        serialize_bytes(&[u8]) -> Self::Ok;
        serialize_unit_struct(&'static str) -> Self::Ok;
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct(&'static str, usize) -> Self::SerializeStruct;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Self::Ok, Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, Error> {
        unsupported("serialize_newtype_variant")
    }
}
