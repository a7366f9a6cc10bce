//! The launch ABI of the blackwell family: the forward kernel's parameters in order,
//! the TMA tensor maps the runtime must encode (`cuTensorMapEncodeTiled`) and pass by
//! value as `__grid_constant__` parameters (`.param .align 64 .b8 [128]`), and the
//! LLVM attributes that produce that PTX.

use crate::llvm::kb::{Kb, R};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::types::AnyType;

/// Bytes of a CUtensorMap.
pub const TENSOR_MAP_BYTES: u32 = 128;
/// Alignment CUDA requires of a tensor map.
pub const TENSOR_MAP_ALIGN: u32 = 64;

/// Marks kernel parameter `index` (declared as a pointer) as a by-value 128-byte,
/// 64-byte-aligned aggregate: NVPTX prints it as `.param .align 64 .b8 <kernel>_param_<index>[128]`,
/// which is how a `const __grid_constant__ CUtensorMap` parameter looks. The kernel
/// never loads through the pointer in LLVM IR; TMA instructions take the parameter's
/// generic address (`Kb::param_generic_addr`).
pub fn mark_tensor_map_param(kb: &Kb<'_>, index: u32) -> R<()> {
    let f = kb.func()?;
    let arr = kb.ctx.i8_type().array_type(TENSOR_MAP_BYTES);
    let byval = kb.ctx.create_type_attribute(Attribute::get_named_enum_kind_id("byval"), arr.as_any_type_enum());
    let align = kb.ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("align"), TENSOR_MAP_ALIGN as u64);
    f.add_attribute(AttributeLoc::Param(index), byval);
    f.add_attribute(AttributeLoc::Param(index), align);
    Ok(())
}

/// `.maxntid threads, 1, 1` and `.minnctapersm 1`: ptxas then sizes the launch register
/// budget at 65536 / threads, the pool `setmaxnreg` redistributes.
pub fn set_launch_bounds(kb: &Kb<'_>, threads: u32) -> R<()> {
    let f = kb.func()?;
    f.add_attribute(AttributeLoc::Function, kb.ctx.create_string_attribute("nvvm.maxntid", &threads.to_string()));
    f.add_attribute(AttributeLoc::Function, kb.ctx.create_string_attribute("nvvm.minctasm", "1"));
    Ok(())
}
