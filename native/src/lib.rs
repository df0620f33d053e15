//! The serving data plane's hot loops: stored feature values (the bytes Redis returns) to
//! the bytes of answers, without a Python object per value; and the native fronts that
//! serve the gRPC and REST ports with them.
//!
//! The reference for every function here is `feature_store/serialization/answers.py`; the
//! property tests in `tests/unit/test_native.py` assert byte-identical output. This code
//! takes only the canonical forms the writers produce. Anything else (a value another
//! writer stored in a form Python also reads, or corrupt data) raises `ValueError`, and the
//! caller answers that value with the Python reference, which also owns every error
//! message. So the native path can be faster, never different.
//!
//! - `codecs`: a stored value to JSON, protobuf records or a Python object; float texts
//! - `group`: `GroupCodec`, a group's stored values to answer bytes (and the packed form)
//! - `resp`: RESP2 replies split straight from the socket's bytes
//! - `rows`: an entity's row of an answer (values, statuses, ages), REST and gRPC
//! - `time`: durations, the clock, write times, Feast's event timestamps
//! - `windows`: window aggregations answered from an entity's stored tiles
//! - `logrows`: the serving log's rows, as Arrow's buffers, from the answers' bytes
//! - `hits`: the worker's L1 and planned reads: lookups answered without Python
//! - `front`: the gRPC and REST ports on threads of their own

mod codecs;
mod front;
mod group;
mod hits;
mod logrows;
mod resp;
mod rows;
mod time;
mod windows;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<group::GroupCodec>()?;
    m.add_class::<resp::ReadPlan>()?;
    m.add_class::<front::grpc::GrpcFront>()?;
    m.add_class::<front::grpc::GrpcCall>()?;
    m.add_class::<front::rest::RestFront>()?;
    m.add_class::<front::rest::RestCall>()?;
    m.add_class::<front::served::ServedLog>()?;
    m.add_class::<hits::HitCache>()?;
    m.add_class::<hits::PythonLoad>()?;
    m.add_class::<front::links::FrontRedis>()?;
    m.add_class::<windows::Windows>()?;
    m.add_class::<logrows::LogColumns>()?;
    m.add_function(wrap_pyfunction!(front::auth::key_role, m)?)?;
    m.add_function(wrap_pyfunction!(front::slots::key_slot, m)?)?;
    m.add_function(wrap_pyfunction!(resp::resp_scan, m)?)?;
    m.add_function(wrap_pyfunction!(resp::resp_split, m)?)?;
    m.add_function(wrap_pyfunction!(logrows::grpc_head, m)?)?;
    m.add_function(wrap_pyfunction!(rows::rest_rows, m)?)?;
    m.add_function(wrap_pyfunction!(rows::grpc_rows, m)?)?;
    m.add_function(wrap_pyfunction!(codecs::encode_float32_many, m)?)?;
    m.add_function(wrap_pyfunction!(codecs::float32_json, m)?)?;
    m.add_function(wrap_pyfunction!(codecs::float64_json, m)?)?;
    Ok(())
}
