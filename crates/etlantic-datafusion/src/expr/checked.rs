//! Row-level errors: checked integer arithmetic and a volatile `raise_error`.
//!
//! DataFusion's `+`, `-` and `*` wrap around on integer overflow; DTCS makes overflow an
//! error. The checked functions compute on `Int64` with Arrow's checked kernels.
//! [`raise_error`] fails when it is evaluated on at least one row; in a `CASE` branch it
//! reports DTCS's row-level errors (`to_integer(1.5)`, `sqrt(-1)`, ...). It is volatile,
//! so the optimizer never evaluates it while folding constants.

use arrow::array::{Array, ArrayRef};
use arrow::compute::kernels::numeric;
use arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, Result as DfResult, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Expr as DfExpr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use std::any::Any;
use std::sync::{Arc, OnceLock};

/// The operation of a [`CheckedArith`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ArithOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
}

/// `Int64 op Int64` failing on overflow.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct CheckedArith {
    op: ArithOp,
    signature: Signature,
}

impl CheckedArith {
    fn new(op: ArithOp) -> Self {
        CheckedArith {
            op,
            signature: Signature::exact(
                vec![DataType::Int64, DataType::Int64],
                Volatility::Immutable,
            ),
        }
    }
}

impl ScalarUDFImpl for CheckedArith {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        match self.op {
            ArithOp::Add => "etlantic_checked_add",
            ArithOp::Sub => "etlantic_checked_sub",
            ArithOp::Mul => "etlantic_checked_mul",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let all_scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let (a, b): (&ArrayRef, &ArrayRef) = (&arrays[0], &arrays[1]);
        let result = match self.op {
            ArithOp::Add => numeric::add(a, b),
            ArithOp::Sub => numeric::sub(a, b),
            ArithOp::Mul => numeric::mul(a, b),
        }?;
        if all_scalar {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &result, 0,
            )?))
        } else {
            Ok(ColumnarValue::Array(result))
        }
    }
}

fn udf(op: ArithOp) -> Arc<ScalarUDF> {
    static ADD: OnceLock<Arc<ScalarUDF>> = OnceLock::new();
    static SUB: OnceLock<Arc<ScalarUDF>> = OnceLock::new();
    static MUL: OnceLock<Arc<ScalarUDF>> = OnceLock::new();
    let cell = match op {
        ArithOp::Add => &ADD,
        ArithOp::Sub => &SUB,
        ArithOp::Mul => &MUL,
    };
    cell.get_or_init(|| Arc::new(ScalarUDF::new_from_impl(CheckedArith::new(op))))
        .clone()
}

/// `a op b` on integers, as `Int64`, failing on overflow.
pub(crate) fn checked(op: ArithOp, a: DfExpr, b: DfExpr) -> DfExpr {
    let i64 = |e: DfExpr| datafusion::logical_expr::cast(e, DataType::Int64);
    udf(op).call(vec![i64(a), i64(b)])
}

/// Fails with its message (and the offending value) when evaluated on any row.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct RaiseError {
    signature: Signature,
}

impl ScalarUDFImpl for RaiseError {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "etlantic_raise_error"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Null)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        if args.number_rows == 0 {
            return Ok(ColumnarValue::Scalar(ScalarValue::Null));
        }
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let text = |i: usize| -> String {
            arrays
                .get(i)
                .filter(|a| !a.is_empty())
                .and_then(|a| ScalarValue::try_from_array(a, 0).ok())
                .map(|v| v.to_string())
                .unwrap_or_default()
        };
        Err(DataFusionError::Execution(format!(
            "{}; got {}",
            text(0),
            text(1)
        )))
    }
}

/// `raise_error(message, value)` typed as `ty` (see [`RaiseError`]).
pub(crate) fn raise_error(message: &str, value: DfExpr, ty: DataType) -> DfExpr {
    static RAISE: OnceLock<Arc<ScalarUDF>> = OnceLock::new();
    let udf = RAISE
        .get_or_init(|| {
            Arc::new(ScalarUDF::new_from_impl(RaiseError {
                signature: Signature::any(2, Volatility::Volatile),
            }))
        })
        .clone();
    datafusion::logical_expr::cast(
        udf.call(vec![
            datafusion::logical_expr::lit(message.to_string()),
            datafusion::logical_expr::cast(value, DataType::Utf8),
        ]),
        ty,
    )
}
