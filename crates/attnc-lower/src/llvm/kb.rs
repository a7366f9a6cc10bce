//! `Kb`, the kernel builder: a thin layer over inkwell that every family uses to emit
//! SIMT code. It keeps the current function, names values after what they hold, and
//! wraps the PTX instructions LLVM has no intrinsic for as inline asm (the asm text
//! starts with a `// what` comment so the PTX stays navigable).
//!
//! Memory is addressed with plain integers (i64 global, i32 shared) and accessed with
//! inline PTX, so the layout arithmetic stays visible and no pointer provenance rules
//! get in the way.

use crate::error::LowerError;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::basic_block::BasicBlock;
use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::types::{AnyType, BasicMetadataTypeEnum, BasicTypeEnum, StructType};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};

impl From<BuilderError> for LowerError {
    fn from(e: BuilderError) -> Self {
        LowerError::Llvm(format!("builder: {e}"))
    }
}

pub type R<T> = Result<T, LowerError>;

/// Bytes of a CUtensorMap.
pub const TENSOR_MAP_BYTES: u32 = 128;
/// Alignment CUDA requires of a tensor map.
pub const TENSOR_MAP_ALIGN: u32 = 64;

/// A mutable scalar slot (promoted to a register by mem2reg): loop-carried state such
/// as accumulators, running max and sum.
#[derive(Clone, Copy)]
pub struct Slot<'ctx> {
    pub ptr: PointerValue<'ctx>,
    pub ty: BasicTypeEnum<'ctx>,
}

pub struct Kb<'ctx> {
    pub ctx: &'ctx Context,
    pub module: Module<'ctx>,
    pub b: Builder<'ctx>,
    pub func: Option<FunctionValue<'ctx>>,
    entry: Option<BasicBlock<'ctx>>,
}

impl<'ctx> Kb<'ctx> {
    pub fn new(ctx: &'ctx Context, module_name: &str) -> Self {
        let module = ctx.create_module(module_name);
        module.set_triple(&inkwell::targets::TargetTriple::create("nvptx64-nvidia-cuda"));
        Kb { ctx, module, b: ctx.create_builder(), func: None, entry: None }
    }

    // ---------------------------------------------------------------- functions

    /// Starts a kernel (`ptx_kernel` calling convention) with the given parameter types
    /// and names; returns the parameter values.
    pub fn begin_kernel(
        &mut self,
        name: &str,
        params: &[(BasicMetadataTypeEnum<'ctx>, String)],
    ) -> R<Vec<BasicValueEnum<'ctx>>> {
        let tys: Vec<BasicMetadataTypeEnum> = params.iter().map(|p| p.0).collect();
        let fn_ty = self.ctx.void_type().fn_type(&tys, false);
        let f = self.module.add_function(name, fn_ty, None);
        // CallingConv::PTX_Kernel: marks the function as a `.entry`.
        f.set_call_conventions(71);
        let entry = self.ctx.append_basic_block(f, "entry");
        self.b.position_at_end(entry);
        self.func = Some(f);
        self.entry = Some(entry);
        let mut out = Vec::new();
        for (i, (_, pname)) in params.iter().enumerate() {
            let p = f.get_nth_param(i as u32).ok_or_else(|| LowerError::Llvm("missing param".into()))?;
            p.set_name(pname);
            out.push(p);
        }
        Ok(out)
    }

    /// Marks parameter `index` of the current kernel (declared as a pointer) as a
    /// by-value 128-byte, 64-byte-aligned aggregate: NVPTX prints it as
    /// `.param .align 64 .b8 <kernel>_param_<index>[128]`, which is how a
    /// `const __grid_constant__ CUtensorMap` parameter looks. The kernel never loads
    /// through the pointer in LLVM IR; TMA instructions take the parameter's generic
    /// address (`Kb::param_generic_addr`).
    pub fn mark_tensor_map_param(&self, index: u32) -> R<()> {
        let f = self.func()?;
        let arr = self.ctx.i8_type().array_type(TENSOR_MAP_BYTES);
        let byval = self.ctx.create_type_attribute(Attribute::get_named_enum_kind_id("byval"), arr.as_any_type_enum());
        let align = self.ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("align"), TENSOR_MAP_ALIGN as u64);
        f.add_attribute(AttributeLoc::Param(index), byval);
        f.add_attribute(AttributeLoc::Param(index), align);
        Ok(())
    }

    /// `.maxntid threads, 1, 1` and `.minnctapersm 1` on the current kernel: ptxas then
    /// sizes the launch register budget at 65536 / threads, the pool `setmaxnreg`
    /// redistributes.
    pub fn set_launch_bounds(&self, threads: u32) -> R<()> {
        let f = self.func()?;
        f.add_attribute(AttributeLoc::Function, self.ctx.create_string_attribute("nvvm.maxntid", &threads.to_string()));
        f.add_attribute(AttributeLoc::Function, self.ctx.create_string_attribute("nvvm.minctasm", "1"));
        Ok(())
    }

    /// `.reqnctapercluster x, y, z` on the current kernel: it launches as clusters of that
    /// shape (the blackwell 2-CTA mode pairs CTAs in clusters of two).
    pub fn set_cluster_dims(&self, x: u32, y: u32, z: u32) -> R<()> {
        let f = self.func()?;
        f.add_attribute(
            AttributeLoc::Function,
            self.ctx.create_string_attribute("nvvm.cluster_dim", &format!("{x},{y},{z}")),
        );
        Ok(())
    }

    /// `.maxnreg n` on the current kernel: ptxas allocates at most `n` registers per
    /// thread. Near the 255 ceiling its allocation is erratic (a few spilled bytes at 255
    /// that a lower cap avoids); a cap lets a kernel that needs ~200 keep its schedule.
    pub fn set_max_regs(&self, n: u32) -> R<()> {
        let f = self.func()?;
        f.add_attribute(AttributeLoc::Function, self.ctx.create_string_attribute("nvvm.maxnreg", &n.to_string()));
        Ok(())
    }

    pub fn func(&self) -> R<FunctionValue<'ctx>> {
        self.func.ok_or_else(|| LowerError::Llvm("no function started".into()))
    }

    pub fn block(&self, name: &str) -> R<BasicBlock<'ctx>> {
        Ok(self.ctx.append_basic_block(self.func()?, name))
    }

    // ---------------------------------------------------------------- constants

    pub fn i32c(&self, v: i64) -> IntValue<'ctx> {
        self.ctx.i32_type().const_int(v as u64, true)
    }
    pub fn i64c(&self, v: i64) -> IntValue<'ctx> {
        self.ctx.i64_type().const_int(v as u64, true)
    }
    pub fn f32c(&self, v: f64) -> FloatValue<'ctx> {
        self.ctx.f32_type().const_float(v)
    }
    pub fn boolc(&self, v: bool) -> IntValue<'ctx> {
        self.ctx.bool_type().const_int(v as u64, false)
    }

    // ---------------------------------------------------------------- slots

    /// A scalar slot allocated in the entry block (so mem2reg promotes it).
    pub fn slot(&self, ty: BasicTypeEnum<'ctx>, name: &str, init: BasicValueEnum<'ctx>) -> R<Slot<'ctx>> {
        let entry = self.entry.ok_or_else(|| LowerError::Llvm("no entry".into()))?;
        let tmp = self.ctx.create_builder();
        match entry.get_first_instruction() {
            Some(i) => tmp.position_before(&i),
            None => tmp.position_at_end(entry),
        }
        let ptr = tmp.build_alloca(ty, name)?;
        self.b.build_store(ptr, init)?;
        Ok(Slot { ptr, ty })
    }
    pub fn slot_f32(&self, name: &str, init: FloatValue<'ctx>) -> R<Slot<'ctx>> {
        self.slot(self.ctx.f32_type().into(), name, init.into())
    }
    pub fn slot_i32(&self, name: &str, init: IntValue<'ctx>) -> R<Slot<'ctx>> {
        self.slot(self.ctx.i32_type().into(), name, init.into())
    }
    pub fn get(&self, s: Slot<'ctx>, name: &str) -> R<BasicValueEnum<'ctx>> {
        Ok(self.b.build_load(s.ty, s.ptr, name)?)
    }
    pub fn get_f(&self, s: Slot<'ctx>, name: &str) -> R<FloatValue<'ctx>> {
        Ok(self.get(s, name)?.into_float_value())
    }
    pub fn get_i(&self, s: Slot<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        Ok(self.get(s, name)?.into_int_value())
    }
    pub fn set<V: Into<BasicValueEnum<'ctx>>>(&self, s: Slot<'ctx>, v: V) -> R<()> {
        self.b.build_store(s.ptr, v.into())?;
        Ok(())
    }

    // ---------------------------------------------------------------- integer ops

    pub fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_add(a, b, n)?)
    }
    pub fn sub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_sub(a, b, n)?)
    }
    pub fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_mul(a, b, n)?)
    }
    /// Unsigned division (for non-negative index arithmetic).
    pub fn udiv(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_unsigned_div(a, b, n)?)
    }
    pub fn urem(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_unsigned_rem(a, b, n)?)
    }
    pub fn shl(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_left_shift(a, b, n)?)
    }
    /// Logical (unsigned) right shift.
    pub fn lshr(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_right_shift(a, b, false, n)?)
    }
    pub fn and(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_and(a, b, n)?)
    }
    pub fn or(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_or(a, b, n)?)
    }
    pub fn xor(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_xor(a, b, n)?)
    }
    pub fn not(&self, a: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_not(a, n)?)
    }
    pub fn icmp(&self, p: IntPredicate, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_compare(p, a, b, n)?)
    }
    pub fn select<V: Into<BasicValueEnum<'ctx>>>(
        &self,
        c: IntValue<'ctx>,
        a: V,
        b: V,
        n: &str,
    ) -> R<BasicValueEnum<'ctx>> {
        Ok(self.b.build_select(c, a.into(), b.into(), n)?)
    }
    pub fn select_i(&self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.select(c, a, b, n)?.into_int_value())
    }
    pub fn select_f(
        &self,
        c: IntValue<'ctx>,
        a: FloatValue<'ctx>,
        b: FloatValue<'ctx>,
        n: &str,
    ) -> R<FloatValue<'ctx>> {
        Ok(self.select(c, a, b, n)?.into_float_value())
    }
    pub fn smin(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        let c = self.icmp(IntPredicate::SLT, a, b, "")?;
        self.select_i(c, a, b, n)
    }
    pub fn smax(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        let c = self.icmp(IntPredicate::SGT, a, b, "")?;
        self.select_i(c, a, b, n)
    }
    pub fn sext64(&self, a: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        if a.get_type().get_bit_width() == 64 {
            return Ok(a);
        }
        Ok(self.b.build_int_s_extend(a, self.ctx.i64_type(), n)?)
    }
    pub fn zext64(&self, a: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        if a.get_type().get_bit_width() == 64 {
            return Ok(a);
        }
        Ok(self.b.build_int_z_extend(a, self.ctx.i64_type(), n)?)
    }
    pub fn trunc32(&self, a: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        if a.get_type().get_bit_width() == 32 {
            return Ok(a);
        }
        Ok(self.b.build_int_truncate(a, self.ctx.i32_type(), n)?)
    }
    pub fn zext32(&self, a: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_z_extend(a, self.ctx.i32_type(), n)?)
    }
    /// `ceil(a / b)` for non-negative a and positive b.
    pub fn ceil_div(&self, a: IntValue<'ctx>, b: IntValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        let one = a.get_type().const_int(1, false);
        let t = self.add(a, self.sub(b, one, "")?, "")?;
        self.udiv(t, b, n)
    }

    // ---------------------------------------------------------------- float ops

    pub fn fadd(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_add(a, b, n)?)
    }
    pub fn fsub(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_sub(a, b, n)?)
    }
    pub fn fmul(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_mul(a, b, n)?)
    }
    pub fn fdiv(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_div(a, b, n)?)
    }
    pub fn fneg(&self, a: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_neg(a, n)?)
    }
    pub fn fcmp(&self, p: FloatPredicate, a: FloatValue<'ctx>, b: FloatValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(p, a, b, n)?)
    }
    /// `max` that ignores NaN like PTX `max.f32`.
    pub fn fmax(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        self.asm_f32_2("max.f32 $0, $1, $2;", a, b, n)
    }
    pub fn fmin(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        self.asm_f32_2("min.f32 $0, $1, $2;", a, b, n)
    }
    pub fn fma(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        let f = self.ctx.f32_type();
        let ty = f.fn_type(&[f.into(), f.into(), f.into()], false);
        let v = self.asm(ty, "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f", false, &[a.into(), b.into(), c.into()], n)?;
        Ok(v.into_float_value())
    }
    pub fn si_to_f(&self, a: IntValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_signed_int_to_float(a, self.ctx.f32_type(), n)?)
    }
    /// Float to i32 toward zero, saturating, NaN → 0 (`cvt.rzi.s32.f32`).
    pub fn f_to_si(&self, a: FloatValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[self.ctx.f32_type().into()], false);
        Ok(self.asm(ty, "cvt.rzi.s32.f32 $0, $1;", "=r,f", false, &[a.into()], n)?.into_int_value())
    }
    pub fn f_bits(&self, a: FloatValue<'ctx>, n: &str) -> R<IntValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.ctx.i32_type(), n)?.into_int_value())
    }
    pub fn bits_f(&self, a: IntValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.ctx.f32_type(), n)?.into_float_value())
    }

    // ---------------------------------------------------------------- inline asm

    /// Calls an inline-asm snippet. `side_effects` keeps it in program order relative to
    /// other side-effecting asm (memory operations, barriers).
    pub fn asm(
        &self,
        ty: inkwell::types::FunctionType<'ctx>,
        text: &str,
        constraints: &str,
        side_effects: bool,
        args: &[BasicMetadataValueEnum<'ctx>],
        name: &str,
    ) -> R<BasicValueEnum<'ctx>> {
        let asm =
            self.ctx.create_inline_asm(ty, text.to_string(), constraints.to_string(), side_effects, false, None, false);
        let call = self.b.build_indirect_call(ty, asm, args, name)?;
        match call.try_as_basic_value() {
            inkwell::values::ValueKind::Basic(v) => Ok(v),
            inkwell::values::ValueKind::Instruction(_) => Ok(self.i32c(0).into()),
        }
    }

    /// Inline asm with no result.
    pub fn asm_void(&self, text: &str, constraints: &str, args: &[BasicMetadataValueEnum<'ctx>]) -> R<()> {
        let tys: Vec<BasicMetadataTypeEnum> = args.iter().map(|a| meta_type(*a)).collect();
        let ty = self.ctx.void_type().fn_type(&tys, false);
        let asm = self.ctx.create_inline_asm(ty, text.to_string(), constraints.to_string(), true, false, None, false);
        self.b.build_indirect_call(ty, asm, args, "")?;
        Ok(())
    }

    fn asm_f32_2(&self, text: &str, a: FloatValue<'ctx>, b: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        let f = self.ctx.f32_type();
        let ty = f.fn_type(&[f.into(), f.into()], false);
        Ok(self.asm(ty, text, "=f,f,f", false, &[a.into(), b.into()], n)?.into_float_value())
    }

    /// A unary f32 instruction, e.g. `ex2.approx.ftz.f32`.
    pub fn asm_f32_1(&self, text: &str, a: FloatValue<'ctx>, n: &str) -> R<FloatValue<'ctx>> {
        let f = self.ctx.f32_type();
        let ty = f.fn_type(&[f.into()], false);
        Ok(self.asm(ty, text, "=f,f", false, &[a.into()], n)?.into_float_value())
    }

    /// A PTX comment marking a section of the kernel (survives into the PTX). The
    /// driver's PTX JIT rejects non-ASCII bytes, so `·`, `ᵀ` and the like are spelled
    /// out in ASCII.
    pub fn section(&self, text: &str) -> R<()> {
        self.asm_void(&format!("// {}", ascii_comment(text)), "", &[])
    }

    /// An anonymous struct of `n` values of type `t` (multi-result asm).
    pub fn struct_of(&self, t: BasicTypeEnum<'ctx>, n: usize) -> StructType<'ctx> {
        let fields: Vec<BasicTypeEnum> = std::iter::repeat_n(t, n).collect();
        self.ctx.struct_type(&fields, false)
    }

    pub fn extract(&self, v: BasicValueEnum<'ctx>, i: u32, n: &str) -> R<BasicValueEnum<'ctx>> {
        let s = v.into_struct_value();
        Ok(self.b.build_extract_value(s, i, n)?)
    }

    // ---------------------------------------------------------------- special registers

    pub fn sreg(&self, reg: &str, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[], false);
        Ok(self.asm(ty, &format!("mov.u32 $0, %{reg};"), "=r", false, &[], name)?.into_int_value())
    }

    /// `v` through an opaque (side-effecting) move, so LLVM cannot hoist what is derived
    /// from it out of a loop. NVPTX's LICM does not weigh register pressure; per-chunk
    /// address arithmetic hoisted out of the K/V loop would otherwise occupy dozens of
    /// registers for the whole loop.
    pub fn opaque_i32(&self, v: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
        let i = self.ctx.i32_type();
        let ty = i.fn_type(&[i.into()], false);
        Ok(self.asm(ty, "mov.b32 $0, $1;", "=r,r", true, &[v.into()], name)?.into_int_value())
    }

    // ---------------------------------------------------------------- control flow

    /// `if cond { then() }`.
    pub fn if_then(&mut self, cond: IntValue<'ctx>, name: &str, then: impl FnOnce(&mut Self) -> R<()>) -> R<()> {
        let t = self.block(&format!("{name}.then"))?;
        let end = self.block(&format!("{name}.end"))?;
        self.b.build_conditional_branch(cond, t, end)?;
        self.b.position_at_end(t);
        then(self)?;
        self.b.build_unconditional_branch(end)?;
        self.b.position_at_end(end);
        Ok(())
    }

    /// `if cond { a() } else { b() }`.
    pub fn if_else(
        &mut self,
        cond: IntValue<'ctx>,
        name: &str,
        a: impl FnOnce(&mut Self) -> R<()>,
        b: impl FnOnce(&mut Self) -> R<()>,
    ) -> R<()> {
        let t = self.block(&format!("{name}.then"))?;
        let e = self.block(&format!("{name}.else"))?;
        let end = self.block(&format!("{name}.end"))?;
        self.b.build_conditional_branch(cond, t, e)?;
        self.b.position_at_end(t);
        a(self)?;
        self.b.build_unconditional_branch(end)?;
        self.b.position_at_end(e);
        b(self)?;
        self.b.build_unconditional_branch(end)?;
        self.b.position_at_end(end);
        Ok(())
    }

    /// `for i in start..end { body(i) }` over i32, with the counter in a slot.
    pub fn for_range(
        &mut self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        name: &str,
        body: impl FnOnce(&mut Self, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        self.for_range_unroll(start, end, name, true, body)
    }

    /// [`Kb::for_range`], kept a loop by ptxas when `unroll` is false (`.pragma
    /// "nounroll"` in the loop's header): ptxas unrolls a constant trip count whatever
    /// LLVM left, which multiplies code that runs only a few times per launch.
    pub fn for_range_unroll(
        &mut self,
        start: IntValue<'ctx>,
        end: IntValue<'ctx>,
        name: &str,
        unroll: bool,
        body: impl FnOnce(&mut Self, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        let counter = self.slot_i32(&format!("{name}.i"), start)?;
        let head = self.block(&format!("{name}.head"))?;
        let body_bb = self.block(&format!("{name}.body"))?;
        let exit = self.block(&format!("{name}.exit"))?;
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(head);
        if !unroll {
            let ty = self.ctx.void_type().fn_type(&[], false);
            self.asm(ty, ".pragma \"nounroll\";", "", true, &[], "")?;
        }
        let i = self.get_i(counter, name)?;
        let c = self.icmp(IntPredicate::SLT, i, end, "")?;
        self.b.build_conditional_branch(c, body_bb, exit)?;
        self.b.position_at_end(body_bb);
        body(self, i)?;
        let i = self.get_i(counter, "")?;
        let next = self.add(i, self.i32c(1), "")?;
        self.set(counter, next)?;
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(exit);
        Ok(())
    }

    /// A `while` loop: `cond()` is evaluated at the head.
    pub fn while_loop(
        &mut self,
        name: &str,
        cond: impl FnOnce(&mut Self) -> R<IntValue<'ctx>>,
        body: impl FnOnce(&mut Self) -> R<()>,
    ) -> R<()> {
        let head = self.block(&format!("{name}.head"))?;
        let body_bb = self.block(&format!("{name}.body"))?;
        let exit = self.block(&format!("{name}.exit"))?;
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(head);
        let c = cond(self)?;
        self.b.build_conditional_branch(c, body_bb, exit)?;
        self.b.position_at_end(body_bb);
        body(self)?;
        self.b.build_unconditional_branch(head)?;
        self.b.position_at_end(exit);
        Ok(())
    }

    /// `while cond() { body() }` with the body emitted twice per trip and `cond` tested
    /// before each copy (a rotated loop unrolled by two): a value each trip hands to the
    /// next (a register operand still in flight) then alternates between the two copies'
    /// registers instead of being moved back into one set at every back edge.
    pub fn while_loop_twice(
        &mut self,
        name: &str,
        mut cond: impl FnMut(&mut Self) -> R<IntValue<'ctx>>,
        mut body: impl FnMut(&mut Self) -> R<()>,
    ) -> R<()> {
        let first = self.block(&format!("{name}.first"))?;
        let second = self.block(&format!("{name}.second"))?;
        let exit = self.block(&format!("{name}.exit"))?;
        let c = cond(self)?;
        self.b.build_conditional_branch(c, first, exit)?;
        for (at, then) in [(first, second), (second, first)] {
            self.b.position_at_end(at);
            body(self)?;
            let c = cond(self)?;
            self.b.build_conditional_branch(c, then, exit)?;
        }
        self.b.position_at_end(exit);
        Ok(())
    }

    /// Returns from the kernel when `cond` holds.
    pub fn return_if(&mut self, cond: IntValue<'ctx>, name: &str) -> R<()> {
        let ret = self.block(&format!("{name}.ret"))?;
        let cont = self.block(&format!("{name}.cont"))?;
        self.b.build_conditional_branch(cond, ret, cont)?;
        self.b.position_at_end(ret);
        self.b.build_return(None)?;
        self.b.position_at_end(cont);
        Ok(())
    }

    pub fn ret(&self) -> R<()> {
        self.b.build_return(None)?;
        Ok(())
    }
}

/// `text` with non-ASCII characters replaced by ASCII spellings (PTX must be ASCII).
pub fn ascii_comment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '·' | '×' => out.push('*'),
            'ᵀ' => out.push_str("^T"),
            '≤' => out.push_str("<="),
            '≥' => out.push_str(">="),
            '→' => out.push_str("->"),
            '—' | '–' => out.push('-'),
            c if c.is_ascii() && c != '\n' && c != '$' => out.push(c),
            _ => out.push('?'),
        }
    }
    out
}

/// The metadata type of an argument value (for asm function types).
pub fn meta_type(v: BasicMetadataValueEnum<'_>) -> BasicMetadataTypeEnum<'_> {
    match v {
        BasicMetadataValueEnum::IntValue(i) => i.get_type().into(),
        BasicMetadataValueEnum::FloatValue(f) => f.get_type().into(),
        BasicMetadataValueEnum::PointerValue(p) => p.get_type().into(),
        BasicMetadataValueEnum::VectorValue(p) => p.get_type().into(),
        BasicMetadataValueEnum::StructValue(p) => p.get_type().into(),
        BasicMetadataValueEnum::ArrayValue(p) => p.get_type().into(),
        other => panic!("unsupported asm operand {other:?}"),
    }
}
