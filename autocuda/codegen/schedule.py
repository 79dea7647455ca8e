"""The body of a neuron kernel, written from its plan: declarations, the loop schedule, loads, the per-lane
step, stores.

Each thread owns `lanes` consecutive neurons starting at ac_n0 and keeps their states in register arrays indexed
by lane. The schedules: a single step ("none"), a plain time loop forward or in reverse, a ring of asynchronous
copies in shared memory (`KernelPlan.depth`), blocks of steps staged in registers (`KernelPlan.staged`), and
backward over replayed segments (`KernelPlan.segment`). Arrays kept for a register are named by prefixing it
(ac_ring_<register>, ac_staged_<register>): a register may end in a user's name, which a suffix could extend
into another's.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..toolchain.code import Code
from .broadcast import CHANNEL_RUN, GRADIENT_GROUP, channel_run
from .noise import draw_cache_init, draw_cache_type
from .options import VECTOR_CTYPES, KernelOptions, KernelPlan, Statement, Transfer, pair_copies

_ROW = "const long long ac_row = t * N + ac_n0;"


@dataclass(frozen=True)
class _Loop:
    """The direction of the time loop: its first step, how it steps ahead, and its bounds as C text."""

    forward: bool

    @property
    def first(self) -> str:
        return "0" if self.forward else "T - 1"

    @property
    def ahead(self) -> str:
        return "+" if self.forward else "-"

    def in_range(self, step: str) -> str:
        return f"{step} < T" if self.forward else f"{step} >= 0"

    def clamp(self, step: str) -> str:
        """`step`, or the last step where it runs past it."""
        return f"(({step}) < T ? ({step}) : T - 1)" if self.forward else f"(({step}) >= 0 ? ({step}) : 0LL)"


class BodyWriter:
    """Writes one kernel's body (inside its outer braces) from its plan and options."""

    def __init__(self, plan: KernelPlan, options: KernelOptions) -> None:
        storage = options.dtype
        self.plan, self.options = plan, options
        self.native, self.vector, self.lanes = options.native, options.vector, options.lanes
        self.words = options.lanes // storage.width if self.native else options.lanes
        self.compute_t = (storage if self.native else storage.compute).ctype
        self.element_bytes = storage.torch_dtype.itemsize
        self.vector_t = VECTOR_CTYPES.get(self.lanes * self.element_bytes, "")
        self.pair_copy = pair_copies(options)
        self.loop = _Loop(options.kernel == "fptt")
        self.code = Code(depth=1)
        self.group_sums = 0  # the group sums written so far: each has a scratch of its own on the host runner

    def text(self) -> str:
        self.declarations()
        self.schedule()()
        self.transfers(self.plan.finish)
        return self.code.text

    def schedule(self) -> Callable[[], None]:
        """The loop schedule the plan asks for (the builder sets at most one of segment, depth and staged)."""
        if not self.options.multi_step:
            return self.single_step
        if self.plan.segment:
            return self.segments
        if self.plan.depth > 1:
            return self.ring
        return self.staged if self.plan.staged else self.time_loop

    # -- the parts every schedule shares ------------------------------------------------------------------
    def declarations(self) -> None:
        code, plan = self.code, self.plan
        code.line(f"const long long ac_n0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * {self.lanes};")
        code.line("if (ac_n0 >= N) return;")
        for name in plan.registers:
            code.line(f"{self.compute_t} {name}[{self.words}];")
        for name in plan.histories:
            code.line(f"{self.compute_t} {name}[{plan.segment}][{self.words}];  // per step of a segment, kept by "
                      "its replay")
        for cache in plan.draw_caches:
            code.line(f"{draw_cache_type(plan.draws)} {cache}[{self.words}];  // a call site's draws, per lane")
            code.line("#pragma unroll")
            code.line(f"for (int lane = 0; lane < {self.words}; ++lane) {draw_cache_init(plan.draws)}({cache}[lane]);")
        for constant in plan.constants:
            code.line(f"// {constant.comment}")
            code.line(f"const {self.compute_t} {constant.target} = {constant.value};")
        for item in plan.streamed if plan.staged else ():
            code.line(f"{self.vector_t} ac_staged_{item.register}[{self.options.staged_blocks + 1}][{plan.staged}];"
                      "  // step t's elements, loaded blocks early")
        for item in plan.streamed if plan.depth > 1 else ():
            slots = self.options.block * (2 if self.pair_copy else self.lanes)
            code.line(f"__shared__ __align__(16) {item.element} ac_ring_{item.register}[{plan.depth}][{slots}];"
                      f"  // step t's elements, copied {plan.depth} steps early")
        self.transfers(plan.setup)

    def step(self) -> None:
        """One step's loads, its statements lane by lane, and its stores (after a line of indentation alone)."""
        self.code.line()
        self.transfers(self.plan.loads)
        self.lane_loop(self.plan.body)
        self.transfers(self.plan.stores)

    def lane_loop(self, statements: list[Statement]) -> None:
        code = self.code
        code.line("#pragma unroll")
        with code.block(f"for (int lane = 0; lane < {self.words}; ++lane)"):
            for statement in statements:
                if statement.comment:
                    code.line(f"// {statement.comment}")
                declared = f"const {self.compute_t} " if statement.declare else ""
                value = (f"({statement.guard}) ? {statement.value} : {statement.otherwise}" if statement.guard
                         else statement.value)
                code.line(f"{declared}{statement.target} = {value};")

    def into_registers(self, item: Transfer, target: str, element: Callable[[str], str]) -> None:
        """A loop converting a step's elements (`element(index)`, as C text) into the registers `target`: native
        packed arithmetic builds each word from two; a guarded load gives `otherwise` where false."""
        got = (item.pair_value(element("2 * lane"), element("2 * lane + 1")) if self.native
               else item.lane_value(element("lane")))
        value = f"({item.guard}) ? {got} : {item.otherwise}" if item.guard else got
        self.code.line("#pragma unroll")
        self.code.line(f"for (int lane = 0; lane < {self.words}; ++lane) {target}[lane] = {value};")

    def transfers(self, items: list[Transfer], slot: str = "") -> None:
        for item in items:
            self.code.line(f"// {item.comment}")
            if not item.pointer:
                self.code.line("#pragma unroll")
                self.code.line(f"for (int lane = 0; lane < {self.words}; ++lane) {item.register}{slot}[lane] = "
                               f"{item.value};")
            elif item.store:
                self.store(item)
            else:
                self.load(item, slot)

    def store(self, item: Transfer) -> None:
        code, lanes = self.code, self.lanes
        with code.block(f"if ({item.guard})" if item.guard else ""):
            code.line(f"{item.element} ac_stage[{lanes}];")
            code.line("#pragma unroll")
            if self.native:
                with code.block(f"for (int lane = 0; lane < {self.words}; ++lane)"):
                    code.line(f"ac_stage[2 * lane] = {item.half_value(0, item.register + '[lane]')};")
                    code.line(f"ac_stage[2 * lane + 1] = {item.half_value(1, item.register + '[lane]')};")
            else:
                code.line(f"for (int lane = 0; lane < {lanes}; ++lane) ac_stage[lane] = "
                          f"{item.lane_value(item.register + '[lane]')};")
            if item.channel_sum:
                self.channel_sum(item)
            elif item.group_sum:
                self.group_sum(item)
            elif self.vector and item.vectorizable:
                # elements meet the vector through memcpy: a pointer cast would break aliasing rules
                code.line(f"{self.vector_t} ac_vec;  ")
                code.line("memcpy(&ac_vec, ac_stage, sizeof(ac_vec));")
                code.line(f"*reinterpret_cast<{self.vector_t}*>(&{item.pointer}[{item.offset}]) = ac_vec;")
            else:
                code.line("#pragma unroll")
                with code.block(f"for (int lane = 0; lane < {lanes}; ++lane)"):
                    code.line(f"if (ac_n0 + lane < N) {item.element_ref} = ac_stage[lane];")

    def channel_sum(self, item: Transfer) -> None:
        """Add each lane's value (`ac_stage`) into its channel's sum (a lane past N adds nothing). A thread's lanes
        are consecutive neurons, all in one run of a channel except where a run ends among them. Threads whose
        lanes share a run add their sum, shared across the warp (`ac_add_to_channel`: every thread of a run
        calls it together); the threads where a run ends add each lane's value alone."""
        code, lanes, zero = self.code, self.lanes, f"{item.element}(0)"
        value = f"ac_n0 + lane < N ? ac_stage[lane] : {zero}"
        if lanes == 1:
            code.line("#pragma unroll")
            code.line(f"for (int lane = 0; lane < 1; ++lane) ac_add_to_channel({item.pointer}, {CHANNEL_RUN}, "
                      f"ac_channels, {value});")
            return
        with code.block(f"if ({channel_run('0')} == {channel_run(str(lanes - 1))})"):
            code.line(f"{item.element} ac_sum = {zero};")
            code.line("#pragma unroll")
            code.line(f"for (int lane = 0; lane < {lanes}; ++lane) ac_sum += {value};")
            code.line(f"ac_add_to_channel({item.pointer}, {channel_run('0')}, ac_channels, ac_sum);")
        with code.block("else"):
            code.line("#pragma unroll")
            code.line(f"for (int lane = 0; lane < {lanes}; ++lane) ac_add_to_channel_alone({item.pointer}, "
                      f"{CHANNEL_RUN}, ac_channels, {value});")

    def group_sum(self, item: Transfer) -> None:
        """Add the thread's lanes (`ac_stage`) below N pairwise, the lower levels of its group's tree
        (`ac_add_to_group` adds the threads' sums in the levels above)."""
        code, lanes = self.code, self.lanes
        if GRADIENT_GROUP % lanes or self.options.block % 32:
            raise ValueError(f"a shared parameter's gradient is summed per {GRADIENT_GROUP} neurons by warps: {lanes} "
                             f"neurons per thread must divide them, and {self.options.block} threads per block be "
                             f"whole warps")
        step = 1
        while step < lanes:
            for lane in range(0, lanes, 2 * step):
                code.line(f"if (ac_n0 + {lane + step} < N) ac_stage[{lane}] += ac_stage[{lane + step}];")
            step *= 2
        code.line(f"ac_add_to_group<{self.group_sums}>({item.pointer}, ac_n0, N, {lanes}, ac_stage[0]);")
        self.group_sums += 1

    def load(self, item: Transfer, slot: str) -> None:
        code, lanes = self.code, self.lanes
        with code.block():
            code.line(f"{item.element} ac_stage[{lanes}] = " + "{};")
            with code.block(f"if ({item.guard})" if item.guard else ""):
                if self.vector and item.vectorizable:
                    code.line(f"{self.vector_t} ac_vec = *reinterpret_cast<const {self.vector_t}*>"
                              f"(&{item.pointer}[{item.offset}]);")
                    code.line("memcpy(ac_stage, &ac_vec, sizeof(ac_vec));")
                else:
                    code.line("#pragma unroll")
                    with code.block(f"for (int lane = 0; lane < {lanes}; ++lane)"):
                        code.line(f"if (ac_n0 + lane < N) ac_stage[lane] = {item.element_ref};")
            self.into_registers(item, item.register + slot, lambda index: f"ac_stage[{index}]")

    # -- schedules ----------------------------------------------------------------------------------------
    def single_step(self) -> None:
        self.code.line("const long long ac_row = ac_n0;")
        self.step()
        self.code.blank()

    def time_loop(self) -> None:
        code, loop = self.code, self.loop
        if self.options.unroll > 1:
            code.line(f"#pragma unroll {self.options.unroll}")
        with code.block(f"for (long long t = {loop.first}; {loop.in_range('t')}; t{'++' if loop.forward else '--'})"):
            code.line(_ROW)
            self.step()
            code.blank()

    def segments(self) -> None:
        """Backward over segments of replayed steps, the last (short where K does not divide T) first."""
        code, segment = self.code, self.plan.segment
        code.line("// the last segment first, short where K does not divide T; the full ones without a test per "
                  "step, so that")
        code.line("// their loads issue together")
        code.line(f"const long long ac_short = T % {segment};")
        with code.block("if (ac_short > 0)"):
            code.line("const long long ac_s0 = T - ac_short;")
            self.segment_pass(short=True)
        with code.block(f"for (long long ac_s0 = T - ac_short - {segment}; ac_s0 >= 0; ac_s0 -= {segment})"):
            self.segment_pass(short=False)
        code.blank()
        code.blank()

    def segment_pass(self, short: bool) -> None:
        """Replay the segment's steps forward from its checkpoint into the histories, then run the step in
        reverse over them; the short segment tests each step against T."""
        code, plan = self.code, self.plan
        self.transfers(plan.replay_setup)
        code.line("#pragma unroll")
        with code.block(f"for (int ac_k = 0; ac_k < {plan.segment}; ++ac_k)",
                        note="  // the replay: the segment's steps, forward"):
            code.line("const long long t = ac_s0 + ac_k;")
            with code.block("if (t < T)" if short else "", indent=False):
                code.line(_ROW)
                self.transfers(plan.replay_loads)
                self.lane_loop(plan.replay_body)
        code.line("#pragma unroll")
        with code.block(f"for (int ac_k = {plan.segment - 1}; ac_k >= 0; --ac_k)",
                        note="  // the step in reverse, over the replay's values"):
            code.line("const long long t = ac_s0 + ac_k;")
            with code.block("if (t < T)" if short else "", indent=False):
                code.line(_ROW)
                self.step()

    def ring(self) -> None:
        """Each step's streamed inputs are copied into shared memory `depth` steps before it runs and waited on
        by count; copies past the last step re-read the last step. Each thread reads only its own slots, so no
        barrier is needed; the ring's index stays static (a guard per step, not a break)."""
        code, loop, depth = self.code, self.loop, self.plan.depth
        code.line(f"// software pipeline: each step's streamed inputs are copied into shared memory {depth} steps "
                  "before it")
        code.line("// runs, and waited on by count. Copies past the last step re-read the last step (a slot never "
                  "used may hold")
        code.line("// anything). Each thread reads only its own slots: no barrier.")
        code.line("#pragma unroll")
        with code.block(f"for (int ac_d = 0; ac_d < {depth}; ++ac_d)"):
            code.line(f"const long long t = {loop.clamp(f'{loop.first} {loop.ahead} ac_d')};")
            code.line(_ROW)
            self.fetch()
        with code.block(f"for (long long ac_t0 = {loop.first}; {loop.in_range('ac_t0')}; "
                        f"ac_t0 {loop.ahead}= {depth})"):
            code.line("#pragma unroll")
            with code.block(f"for (int ac_d = 0; ac_d < {depth}; ++ac_d)"):
                code.line(f"const long long t = ac_t0 {loop.ahead} ac_d;")
                with code.block(f"if ({loop.in_range('t')})", note="  ", indent=False):
                    code.line(_ROW)
                    self.consume()
                    self.step()
                    code.blank()
                    with code.block():
                        code.line(f"const long long ac_t_ahead = {loop.clamp(f't {loop.ahead} {depth}')};")
                        code.line("const long long t = ac_t_ahead;")
                        code.line(_ROW)
                        self.fetch()
        code.line("ac_wait_copies<0>();  // copies past the last step: none may outlive the thread")

    def fetch(self) -> None:
        """Copy this step's streamed inputs into ring slot ac_d."""
        code, lanes = self.code, self.lanes
        for item in self.plan.streamed:
            ring = f"ac_ring_{item.register}[ac_d]"
            code.line(f"// {item.comment}: copied into the ring")
            with code.block(f"if ({item.guard})" if item.guard else ""):
                if self.vector and item.vectorizable:
                    code.line(f"ac_copy_async<{lanes * self.element_bytes}>(&{ring}[threadIdx.x * {lanes}], "
                              f"&{item.pointer}[{item.offset}]);")
                elif self.pair_copy:
                    code.line("// a 2-byte element cannot be copied asynchronously: copy the aligned pair holding it"
                              " (N is even)")
                    code.line(f"ac_copy_async<4>(&{ring}[threadIdx.x * 2], &{item.pointer}[({item.offset}) & ~1LL]);")
                else:
                    code.line("#pragma unroll")
                    with code.block(f"for (int lane = 0; lane < {lanes}; ++lane)"):
                        code.line(f"if (ac_n0 + lane < N) ac_copy_async<{self.element_bytes}>"
                                  f"(&{ring}[threadIdx.x * {lanes} + lane], &{item.element_ref});")
        code.line("ac_commit_copies();")

    def consume(self) -> None:
        """Wait for this step's copies, then convert them from ring slot ac_d into the registers."""
        self.code.line(f"ac_wait_copies<{self.plan.depth - 1}>();  // this step's copies have landed; later steps' "
                       "stay in flight")
        for item in self.plan.streamed:
            ring = f"ac_ring_{item.register}[ac_d]"
            first = f"threadIdx.x * 2 + (({item.offset}) & 1)" if self.pair_copy else f"threadIdx.x * {self.lanes}"
            self.code.line(f"// {item.comment}")
            self.into_registers(item, item.register, functools.partial(_ring_slot, ring, first))

    def staged(self) -> None:
        """The streamed inputs of each block of `staged` steps are loaded `staged_blocks` blocks before it runs and
        stay as stored until their step converts them; after each block the blocks move up one."""
        code, loop, steps, blocks = self.code, self.loop, self.plan.staged, self.options.staged_blocks
        code.line(f"// software pipeline in registers: the streamed inputs of each block of {steps} steps are loaded")
        code.line(f"// {blocks} block{'s' if blocks > 1 else ''} before it runs, and stay as stored until their step "
                  "converts them")
        code.line("#pragma unroll")
        with code.block(f"for (int ac_b = 0; ac_b < {blocks}; ++ac_b)"):
            code.line("#pragma unroll")
            with code.block(f"for (int ac_d = 0; ac_d < {steps}; ++ac_d)"):
                code.line(f"const long long t = {loop.first} {loop.ahead} (ac_b * {steps} + ac_d);")
                code.line(_ROW)
                self.stage("[ac_b][ac_d]")
        with code.block(f"for (long long ac_t0 = {loop.first}; {loop.in_range('ac_t0')}; ac_t0 {loop.ahead}= {steps})"):
            code.line("#pragma unroll")
            with code.block(f"for (int ac_d = 0; ac_d < {steps}; ++ac_d)"):
                code.line(f"const long long t = ac_t0 {loop.ahead} ({blocks * steps} + ac_d);")
                code.line(_ROW)
                self.stage(f"[{blocks}][ac_d]")
            code.line("#pragma unroll")
            with code.block(f"for (int ac_d = 0; ac_d < {steps}; ++ac_d)"):
                code.line(f"const long long t = ac_t0 {loop.ahead} ac_d;")
                with code.block(f"if ({loop.in_range('t')})", indent=False):
                    code.line(_ROW)
                    self.unstage("[0][ac_d]")
                    self.step()
                    code.blank()
            code.line("#pragma unroll")
            with code.block(f"for (int ac_b = 0; ac_b < {blocks}; ++ac_b)", note="  // the blocks move up one"):
                code.line("#pragma unroll")
                with code.block(f"for (int ac_d = 0; ac_d < {steps}; ++ac_d)"):
                    for item in self.plan.streamed:
                        staged = f"ac_staged_{item.register}"
                        code.line(f"{staged}[ac_b][ac_d] = {staged}[ac_b + 1][ac_d];")

    def stage(self, slot: str) -> None:
        """Load step t's streamed inputs, as stored, into their staged registers `slot`."""
        for item in self.plan.streamed:
            with self.code.block(note=f"  // {item.comment}: loaded ahead, kept as stored"):
                when = self.loop.in_range("t") + (f" && ({item.guard})" if item.guard else "")
                self.code.line(f"{self.vector_t} ac_vec = " + "{};")
                self.code.line(f"if ({when}) ac_vec = *reinterpret_cast<const {self.vector_t}*>"
                               f"(&{item.pointer}[{item.offset}]);")
                self.code.line(f"ac_staged_{item.register}{slot} = ac_vec;")

    def unstage(self, slot: str) -> None:
        """Convert step t's staged inputs `slot` into the registers."""
        for item in self.plan.streamed:
            with self.code.block(note=f"  // {item.comment}"):
                self.code.line(f"{item.element} ac_stage[{self.lanes}];")
                self.code.line(f"memcpy(ac_stage, &ac_staged_{item.register}{slot}, sizeof(ac_stage));")
                self.into_registers(item, item.register, lambda index: f"ac_stage[{index}]")


def kernel_body(plan: KernelPlan, options: KernelOptions) -> str:
    """The text inside a neuron kernel's outer braces."""
    return BodyWriter(plan, options).text()


def _ring_slot(ring: str, first: str, index: str) -> str:
    """Element `index` of a thread's share of a ring slot."""
    return f"{ring}[{first} + {index}]"
