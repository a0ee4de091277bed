//! DTCS `round`, ties to even as ETLantic-py rounds (DataFusion's `round` rounds ties
//! away from zero): a scalar function over `etlantic_core::ir::numeric::round_half_even`.

use arrow::array::{Array, ArrayRef, AsArray, Float64Array};
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, Expr as DfExpr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use etlantic_core::ir::numeric::round_half_even;
use std::any::Any;
use std::sync::{Arc, OnceLock};

/// `round(Float64, Int64) -> Float64`, ties to even; null when either argument is.
#[derive(Debug, PartialEq, Eq, Hash)]
struct RoundHalfEven {
    signature: Signature,
}

impl ScalarUDFImpl for RoundHalfEven {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "etlantic_round_half_even"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Float64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let all_scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let x = arrays[0].as_primitive::<Float64Type>();
        let d = arrays[1].as_primitive::<Int64Type>();
        let out: Float64Array = (0..x.len())
            .map(|i| {
                (!x.is_null(i) && !d.is_null(i)).then(|| round_half_even(x.value(i), d.value(i)))
            })
            .collect();
        let out: ArrayRef = Arc::new(out);
        if all_scalar {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?))
        } else {
            Ok(ColumnarValue::Array(out))
        }
    }
}

/// `round(x, digits)`, ties to even, `x` and `digits` cast to `Float64` and `Int64`.
pub(crate) fn round_half_even_expr(x: DfExpr, digits: DfExpr) -> DfExpr {
    static UDF: OnceLock<Arc<ScalarUDF>> = OnceLock::new();
    UDF.get_or_init(|| {
        Arc::new(ScalarUDF::new_from_impl(RoundHalfEven {
            signature: Signature::exact(
                vec![DataType::Float64, DataType::Int64],
                Volatility::Immutable,
            ),
        }))
    })
    .call(vec![
        datafusion::logical_expr::cast(x, DataType::Float64),
        datafusion::logical_expr::cast(digits, DataType::Int64),
    ])
}
