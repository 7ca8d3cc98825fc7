@ Fast paths of the hottest soft-float entry points for the Cortex-M0+ (ARMv6-M Thumb): the
@ matvec's per-group int-to-float, multiplies and add; and the loops that use them most, with those
@ fast paths inline (the whole matvec rows, the f32 dot and axpy of attention). They handle normal operands with a normal
@ result (nearly every call the engine makes) and hand everything else (zeros, subnormals, inf,
@ NaN, overflow, underflow) to the complete C versions in softfloat.c, which they agree with bit
@ for bit: both round to nearest, ties to even (tests/test_softfloat.py checks them against the
@ host's IEEE arithmetic on the emulator). Plain assembly (.s): no C preprocessor, so the C
@ headers the build force-includes do not reach it.
@
@ Significands are kept top-aligned in a register with the rounding bits below them; a result is
@ packed as sign | ((E - 1) << 23) + significand-with-hidden-bit, so that a rounding carry steps
@ into the next exponent (or to infinity) by itself.

    .syntax unified
    .cpu cortex-m0plus
    .thumb

@ r0, r1: 24-bit significands -> r4 = their product >> 16 (N: bit 31 set), r1 = the 16 bits
@ below it << 16 (sticky); clobbers r0, r2, r5
    .macro MULCORE
    lsrs r4, r0, #16            @ ah
    uxth r0, r0                 @ al
    lsrs r5, r1, #16            @ bh
    uxth r1, r1                 @ bl
    movs r2, r4
    muls r2, r1                 @ ah*bl
    muls r1, r0                 @ al*bl
    muls r0, r5                 @ al*bh
    muls r4, r5                 @ ah*bh
    adds r2, r2, r0             @ mid < 2^25
    lsls r0, r2, #16
    lsrs r2, r2, #16
    adds r1, r1, r0             @ low word, carry out
    adcs r4, r2                 @ high word
    lsls r4, r4, #16
    lsrs r0, r1, #16
    lsls r1, r1, #16
    orrs r4, r0
    .endm

@ r4 = R (leading one at 31), r1 = sticky -> r4 = R >> 8 rounded to nearest even (may reach 2^24)
    .macro ROUND
    lsls r0, r4, #24            @ rounding bits: guard at bit 31
    lsrs r4, r4, #8
    cmp r1, #0
    beq 1f
    adds r0, #1                 @ sticky below them
1:  lsls r0, r0, #1             @ C = guard, r0 = the rest
    bcc 3f
    bne 2f
    lsls r2, r4, #31            @ tie: to even
    beq 3f
2:  adds r4, #1
3:
    .endm

@ r0, r1: normal floats, \e = ea + eb - 2 -> r4 = the product of their significands >> 16 with
@ its leading one at bit 31, r1 = the 16 bits below (sticky), \e = E - 1 of the product;
@ clobbers r0, r2, r5
    .macro MUL_SIGS e
    movs r2, #1
    lsls r2, r2, #23
    lsls r0, r0, #9
    lsrs r0, r0, #9
    orrs r0, r2
    lsls r1, r1, #9
    lsrs r1, r1, #9
    orrs r1, r2
    MULCORE
    bmi 1f
    lsls r4, r4, #1             @ product in [1, 2): one bit more
    subs \e, #1
1:  subs \e, #125
    .endm

@ r0 (nonzero) shifted left until its leading one is at bit 31, \e decreased by the shift, in
@ 16, 8, 4, 2, 1 steps (the M0+ has no CLZ); \t is clobbered
    .macro LEAD31 e, t
    lsrs \t, r0, #16
    bne 1f
    lsls r0, r0, #16
    subs \e, #16
1:  lsrs \t, r0, #24
    bne 2f
    lsls r0, r0, #8
    subs \e, #8
2:  lsrs \t, r0, #28
    bne 3f
    lsls r0, r0, #4
    subs \e, #4
3:  lsrs \t, r0, #30
    bne 4f
    lsls r0, r0, #2
    subs \e, #2
4:  cmp r0, #0
    blt 5f
    lsls r0, r0, #1
    subs \e, #1
5:
    .endm

@ ---- float __aeabi_fmul(float a, float b) -----------------------------------------------
@ Normal operands: the product rounds here, also to infinity or to a subnormal; zeros,
@ subnormal operands, infinities and NaN go to flm_sf_mul (softfloat.c).
    .section .text.__aeabi_fmul,"ax",%progbits
    .global __aeabi_fmul
    .type __aeabi_fmul, %function
    .thumb_func
__aeabi_fmul:
    lsls r2, r0, #1
    lsrs r2, r2, #24
    subs r2, #1
    cmp r2, #253
    bhi .Lmul_slow              @ a not normal
    lsls r3, r1, #1
    lsrs r3, r3, #24
    subs r3, #1
    cmp r3, #253
    bhi .Lmul_slow              @ b not normal
    push {r4, r5, lr}
    adds r3, r2, r3             @ ea + eb - 2
    movs r2, r0
    eors r2, r1
    mov r12, r2                 @ bit 31: the sign
    MUL_SIGS r3                 @ r3 = E - 1
    cmp r3, #253
    bhi .Lmul_range
.Lmul_round:
    ROUND
    lsls r3, r3, #23
    adds r4, r4, r3             @ a carry of the significand steps the exponent
.Lmul_sign:
    mov r2, r12
    lsrs r2, r2, #31
    lsls r2, r2, #31
    orrs r4, r2
    movs r0, r4
    pop {r4, r5, pc}
.Lmul_range:
    cmp r3, #0
    bge .Lmul_inf               @ E > 254
    negs r3, r3                 @ E <= 0: the significand shifts right by 1 - E into the subnormals
    cmp r3, #25
    bhs .Lmul_zero              @ under half the smallest subnormal
    movs r2, r4
    lsrs r4, r3
    negs r3, r3
    adds r3, #32
    lsls r2, r3
    orrs r1, r2                 @ the bits shifted out join the sticky bits
    movs r3, #0                 @ exponent field 0 (a rounding carry makes it the smallest normal)
    b .Lmul_round
.Lmul_inf:
    movs r4, #255
    lsls r4, r4, #23
    b .Lmul_sign
.Lmul_zero:
    movs r4, #0
    b .Lmul_sign
.Lmul_slow:
    ldr r3, =flm_sf_mul
    bx r3
    .size __aeabi_fmul, . - __aeabi_fmul

@ ---- float __aeabi_fadd(float a, float b), __aeabi_fsub(a, b) = a + (-b) -----------------
@ No registers to save: r0-r3 and r12 hold everything. Normal operands never need the C version
@ for their result: an overflow gives infinity here, and a difference in the subnormal range is
@ exact (it only arises from operands within a binade of each other: no bits were shifted out).

@ r0 = a, r1 = b, r3 = d = ea - eb -> r0 = a's significand, hidden bit at 30 and 7 rounding bits
@ below; r1 = b's, shifted right by d with the bits shifted out ORed into bit 0; clobbers r2, r3
    .macro ALIGN_SIGS
    movs r2, #1
    lsls r2, r2, #30
    lsls r0, r0, #9
    lsrs r0, r0, #2
    orrs r0, r2
    lsls r1, r1, #9
    lsrs r1, r1, #2
    orrs r1, r2
    movs r2, r1
    lsrs r1, r3
    negs r3, r3
    adds r3, #32
    lsls r2, r3                 @ the bits shifted out (d = 0: a shift by 32 gives 0)
    beq 9f
    movs r2, #1
    orrs r1, r2
9:
    .endm

    .section .text.__aeabi_fadd,"ax",%progbits
    .global __aeabi_fsub
    .type __aeabi_fsub, %function
    .thumb_func
__aeabi_fsub:
    movs r2, #1
    lsls r2, r2, #31
    eors r1, r2
    .global __aeabi_fadd
    .type __aeabi_fadd, %function
    .thumb_func
__aeabi_fadd:
    lsls r2, r0, #1
    lsls r3, r1, #1
    cmp r2, r3
    bhs 1f
    movs r2, r0                 @ |a| < |b|: swap
    movs r0, r1
    movs r1, r2
    lsls r2, r0, #1
    lsls r3, r1, #1
1:  lsrs r2, r2, #24            @ ea >= eb
    lsrs r3, r3, #24
    beq .Ladd_slow              @ b zero or subnormal
    cmp r2, #255
    beq .Ladd_slow              @ inf or NaN
    subs r3, r2, r3             @ d = ea - eb
    cmp r3, #26
    bhs .Ladd_a                 @ |b| under a quarter ulp of |a|: the sum rounds to a
    lsrs r2, r0, #23
    mov r12, r2                 @ sign and exponent of a, the result's (up to the steps below)
    movs r2, r0
    eors r2, r1
    bmi .Ladd_diff
    ALIGN_SIGS
    adds r0, r0, r1             @ leading one at bit 30 or 31
    mov r2, r12
    bpl .Ladd_round
    movs r1, #1
    ands r1, r0
    lsrs r0, r0, #1
    orrs r0, r1                 @ keep the sticky bit
    adds r2, #1
    lsls r1, r2, #24
    lsrs r1, r1, #24
    cmp r1, #255
    bne .Ladd_round
    lsrs r2, r2, #8             @ overflow: infinity of a's sign
    lsls r2, r2, #31
    movs r0, #255
    lsls r0, r0, #23
    orrs r0, r2
    bx lr
.Ladd_diff:
    ALIGN_SIGS
    subs r0, r0, r1
    beq .Ladd_zero              @ x - x = +0
    mov r2, r12
    lsls r3, r2, #24
    lsrs r3, r3, #24
    subs r3, #1                 @ left shifts allowed before the subnormal range
2:  lsrs r1, r0, #30            @ bring the leading one back to bit 30
    bne .Ladd_round
    cmp r3, #0
    beq .Ladd_round             @ subnormal: exponent field 0, no hidden bit
    lsls r0, r0, #1
    subs r2, #1
    subs r3, #1
    b 2b
.Ladd_round:                    @ r0 = significand and rounding bits, r2 = sign and exponent E
    lsls r1, r0, #25            @ rounding bits: guard at bit 31
    lsrs r0, r0, #7
    subs r2, #1
    lsls r2, r2, #23
    adds r0, r0, r2             @ a carry of the significand steps the exponent
    lsls r1, r1, #1             @ C = guard, r1 = the rest
    bcc .Ladd_a
    bne 3f
    lsls r2, r0, #31            @ tie: round to even
    beq .Ladd_a
3:  adds r0, #1
.Ladd_a:
    bx lr
.Ladd_zero:
    movs r0, #0
    bx lr
.Ladd_slow:
    ldr r3, =flm_sf_add
    bx r3
    .size __aeabi_fadd, . - __aeabi_fadd

@ ---- float __aeabi_ui2f(unsigned v), __aeabi_i2f(int v) ----------------------------------
    .section .text.__aeabi_i2f,"ax",%progbits
    .global __aeabi_ui2f
    .type __aeabi_ui2f, %function
    .thumb_func
__aeabi_ui2f:
    movs r1, #0                 @ sign mask
    b 1f
    .global __aeabi_i2f
    .type __aeabi_i2f, %function
    .thumb_func
__aeabi_i2f:
    asrs r1, r0, #31            @ sign mask
    eors r0, r1
    subs r0, r0, r1             @ |v| (2^31 for INT32_MIN, as unsigned)
1:  cmp r0, #0
    beq 9f
    movs r2, #157               @ E - 1 for a leading one at bit 31
    LEAD31 r2, r3
    lsls r3, r0, #24            @ rounding bits: guard at bit 31
    lsrs r0, r0, #8
    lsls r2, r2, #23
    adds r0, r0, r2
    lsls r3, r3, #1             @ C = guard, r3 = the rest
    bcc 8f
    bne 7f
    lsls r2, r0, #31            @ tie: round to even
    beq 8f
7:  adds r0, #1
8:  lsls r1, r1, #31
    orrs r0, r1
9:  bx lr
    .size __aeabi_i2f, . - __aeabi_i2f

@ ---- int __aeabi_fcmp{eq,lt,le,gt,ge}(float a, float b): 1 or 0, 0 when unordered (NaN) -----
@ Both operands become integer keys with the float order: x itself when its sign is clear,
@ -(x & 0x7fffffff) when set (so -0 and +0 both give 0), then one signed compare.
    .macro FCMP name, cond
    .section .text.\name,"ax",%progbits
    .global \name
    .type \name, %function
    .thumb_func
\name:
    movs r2, #255
    lsls r2, r2, #24
    lsls r3, r0, #1
    cmp r3, r2
    bhi 8f                      @ a is NaN
    lsls r3, r1, #1
    cmp r3, r2
    bhi 8f                      @ b is NaN
    asrs r2, r0, #31
    lsls r0, r0, #1
    lsrs r0, r0, #1
    eors r0, r2
    subs r0, r0, r2             @ key(a)
    asrs r2, r1, #31
    lsls r1, r1, #1
    lsrs r1, r1, #1
    eors r1, r2
    subs r1, r1, r2             @ key(b)
    cmp r0, r1
    b\cond 9f
8:  movs r0, #0
    bx lr
9:  movs r0, #1
    bx lr
    .size \name, . - \name
    .endm

    FCMP __aeabi_fcmpeq, eq
    FCMP __aeabi_fcmplt, lt
    FCMP __aeabi_fcmple, le
    FCMP __aeabi_fcmpgt, gt
    FCMP __aeabi_fcmpge, ge

@ ---- float flm_group_term(int32_t isum, float sc, float xs) = (float)isum * (sc * xs) ---------
@ A matvec group's term (kernels.c), both products in one call: isum is exact as a float when
@ |isum| < 2^24, so the second product rounds once from the integer itself. Both roundings are
@ those of two __aeabi_fmul calls; any case off the fast path (isum 0 or >= 2^24, scale or
@ result not normal) goes to flm_group_term_slow, which makes exactly those calls.

@ r0 = isum, r1 = sc, r2 = xs -> r0 = the term on the fast path; \isum is an instruction that
@ loads isum into r0 again (after the first product); the rest branches to \slow; clobbers r1-r7
    .macro TERM isum, slow
    lsls r3, r1, #1
    lsrs r3, r3, #24
    subs r3, #1
    cmp r3, #253
    bhi 6f                      @ sc not normal
    lsls r4, r2, #1
    lsrs r4, r4, #24
    subs r4, #1
    cmp r4, #253
    bhi 6f                      @ xs not normal
    adds r7, r3, r4             @ e_sc + e_xs - 2
    movs r6, r1
    eors r6, r2
    eors r6, r0                 @ bit 31: the sign of the result
    movs r0, r1
    movs r1, r2
    MUL_SIGS r7                 @ r7 = Ec - 1 of c = sc * xs
    cmp r7, #253
    bhi 6f
    ROUND
    lsrs r2, r4, #24
    beq 2f
    lsrs r4, r4, #1             @ rounded up to 2^24: 2^23, one binade up
    adds r7, #1
    cmp r7, #253
    bls 2f
6:  b \slow                     @ within reach of the first half's conditional branches
2:  \isum
    asrs r2, r0, #31
    eors r0, r2
    subs r0, r0, r2             @ n = |isum|
    beq \slow
    lsrs r2, r0, #24
    bne \slow                   @ n >= 2^24: float(isum) would round
    movs r3, #31                @ n's leading one to bit 23; r3 = its position
    LEAD31 r3, r2
    lsrs r0, r0, #8
    movs r1, r4                 @ c's significand
    MULCORE
    bmi 8f
    lsls r4, r4, #1
    subs r3, #1
8:  adds r7, r7, r3
    adds r7, #1                 @ E - 1 of the term
    cmp r7, #253
    bhi \slow
    ROUND
    lsls r7, r7, #23
    adds r4, r4, r7             @ a carry to 2^24 steps the exponent (to inf from the top binade)
    lsrs r6, r6, #31
    lsls r6, r6, #31
    orrs r4, r6
    movs r0, r4
    .endm

    .section .text.flm_group_term,"ax",%progbits
    .global flm_group_term
    .type flm_group_term, %function
    .thumb_func
flm_group_term:
    push {r0, r1, r2, r4, r5, r6, r7, lr}
    TERM "ldr r0, [sp, #0]", .Lterm_slow
    add sp, #12
    pop {r4, r5, r6, r7, pc}
.Lterm_slow:
    pop {r0, r1, r2, r4, r5, r6, r7}
    pop {r3}
    mov lr, r3
    ldr r3, =flm_group_term_slow
    bx r3
    .size flm_group_term, . - flm_group_term

@ ---- whole matvec rows: kernel_hooks.h row_whole (f32 scales, groups of a multiple of 8 codes,
@ word-aligned activations) with the group dots and terms inline and the group loop in registers
@ (compiled C spilled that loop's state around the inline dot, and a call per term saved and
@ restored registers). The sums, terms and adds are row_whole's, in its order: each group's
@ integer dot, its term as flm_group_term forms it (TERM; flm_group_term_slow off the fast path),
@ the first term as the row's value and every later one added by __aeabi_fadd(acc, term); the
@ boot self-check (kernels_check.h) compares these rows with the scalar kernels'.
@
@ float flm_row_q8_m0(const uint8_t *p, const int16_t *x, const float *xs, uint32_t ng, uint32_t code_bytes)
@ float flm_row_q4_m0(...): the same for 4-bit codes (code_bytes = g / 2)
@ Registers: r4 = p (scale, then codes), r5 = x, r6 = the group's integer sum, r7 = the end of its
@ codes (q8: r8, its step loads two code words into r0, r7); r8, r11 = p, x while TERM uses r4-r7; r9 = the row's value so far, r10 = &xs[gi],
@ r12 = the group's scale, lr = its sum during TERM; [sp] = code_bytes, [sp, #4] = &xs[ng].

@ 4 q8 codes (word \w) times 4 activations (int16, two words loaded from r5) into r6; clobbers \w,
@ r1-r3. An activation word holds two codes: SXTH takes the low one, ASRS #16 the high one, one
@ instruction each where a byte of a word took two.
    .macro Q8_WORD w
    ldm r5!, {r1}
    sxtb r2, \w
    sxth r3, r1
    muls r2, r3
    adds r6, r2
    lsrs r2, \w, #8
    sxtb r2, r2
    asrs r1, r1, #16
    muls r2, r1
    adds r6, r2
    ldm r5!, {r1}
    lsrs r2, \w, #16
    sxtb r2, r2
    sxth r3, r1
    muls r2, r3
    adds r6, r2
    asrs \w, \w, #24
    asrs r1, r1, #16
    muls \w, r1
    adds r6, \w
    .endm

@ 8 q8 codes (two words in one load: r0, r7) times 8 activations into r6; clobbers r0-r3, r7
    .macro Q8_PAIR
    ldm r4!, {r0, r7}
    Q8_WORD r0
    Q8_WORD r7
    .endm

@ q4: a nibble (word r0, bits \sh..\sh+3 after LSLS #\sh) times r3 into r6; clobbers r2
    .macro Q4_NIB sh
    lsls r2, r0, #\sh
    asrs r2, r2, #28
    muls r2, r3
    adds r6, r2
    .endm

@ 8 q4 codes (word r0, low nibble first) times 8 activations (int16: four words) into r6;
@ clobbers r0-r3
    .macro Q4_WORD
    ldm r4!, {r0}
    ldm r5!, {r1}
    sxth r3, r1
    Q4_NIB 28
    asrs r3, r1, #16
    Q4_NIB 24
    ldm r5!, {r1}
    sxth r3, r1
    Q4_NIB 20
    asrs r3, r1, #16
    Q4_NIB 16
    ldm r5!, {r1}
    sxth r3, r1
    Q4_NIB 12
    asrs r3, r1, #16
    Q4_NIB 8
    ldm r5!, {r1}
    sxth r3, r1
    Q4_NIB 4
    asrs r0, r0, #28
    asrs r1, r1, #16
    muls r0, r1
    adds r6, r0
    .endm

@ One group: its scale, its dot (two steps of 8 codes a turn: one loop test per 16 codes; a group
@ of an odd number of steps enters at the second, bit \half of code_bytes being the odd step's), its
@ term in r0 (labels 20-29: the macros inside use 1-8)
    .macro GROUP step, half, end
    ldm r4!, {r0}
    mov r12, r0
    movs r6, #0
    ldr r7, [sp, #0]
    lsls r0, r7, #(31 - \half)  @ N = the odd step
    add r7, r4                  @ (the flag-keeping form: N is still the odd step's)
    .ifnc \end, r7
    mov \end, r7               @ (the step uses r7)
    .endif
    bmi 26f
24: \step
26: \step
    cmp r4, \end
    bne 24b
    mov r8, r4
    mov r11, r5
    movs r0, r6
    mov lr, r0
    mov r1, r12
    mov r3, r10
    ldm r3!, {r2}
    mov r10, r3
    TERM "mov r0, lr", 22f
    b 23f
22: mov r0, lr
    mov r1, r12
    mov r2, r10
    subs r2, #4
    ldr r2, [r2]
    bl flm_group_term_slow
23: mov r4, r8
    mov r5, r11
    .endm

@ saves r4-r11 and lr; \n more words of locals at [sp]
    .macro ENTER9 n
    push {r4, r5, r6, r7, lr}
    mov r4, r8
    mov r5, r9
    mov r6, r10
    mov r7, r11
    push {r4, r5, r6, r7}
    sub sp, #(4 * \n)
    .endm

    .macro LEAVE9 n
    add sp, #(4 * \n)
    pop {r4, r5, r6, r7}
    mov r8, r4
    mov r9, r5
    mov r10, r6
    mov r11, r7
    pop {r4, r5, r6, r7, pc}
    .endm

@ A function \name in its own section, entered by ENTER9 \n
    .macro FUNC9 name, n
    .section .text.\name,"ax",%progbits
    .global \name
    .type \name, %function
    .thumb_func
\name:
    ENTER9 \n
    .endm

    .macro ROW name, step, half, end
    FUNC9 \name, 3  @ code_bytes, &xs[ng] and a pad: the stack stays 8-byte aligned
    ldr r4, [sp, #48]           @ code_bytes, above the 12 words
    str r4, [sp, #0]
    lsls r3, r3, #2
    adds r3, r2, r3
    str r3, [sp, #4]
    mov r10, r2
    movs r4, r0
    movs r5, r1
    GROUP \step, \half, \end
    mov r9, r0                  @ the first term is the row's value (0 + term would turn -0 into +0)
    b 21f
20: GROUP \step, \half, \end
    movs r1, r0
    mov r0, r9
    bl __aeabi_fadd
    mov r9, r0
21: ldr r0, [sp, #4]
    cmp r0, r10
    beq 25f
    b 20b                       @ (a group is beyond a conditional branch's reach)
25: mov r0, r9
    LEAVE9 3
    .size \name, . - \name
    .endm

    ROW flm_row_q8_m0, Q8_PAIR, 3, r8   @ a step: 8 code bytes; the codes' end in r8
    ROW flm_row_q4_m0, Q4_WORD, 2, r7   @ a step: 4 code bytes

@ ---- row-scaled matvec rows (docs/formats.md section 1; kernels.c rows_rs): a row's integer part,
@ acc = sum_g k_g * (sum_{c in g} code_c * x_c), exact, then float(acc) * (S * X) inline. A row: f32
@ S, u8 k[ng] padded to 4, then ng groups of g codes; geom = ng | g << 16 (q8: g a multiple of 8;
@ q4: of 32, at most 1024 columns, the whole sum an int32). q8's sum of terms is an int64: an int32
@ in a register whose every add tests the overflow flag (out of line: the row's high word on the
@ stack steps by one), so a row costs one branch not taken a group over an int32 sum; a group's term
@ k_g * isum_g is an int32 up to 32 columns (255 * 128 * 2047 * 32 < 2^31), a longer group's is
@ added as a 64-bit integer (WIDE_ADD). The drivers take a job (softfloat_m0.h flm_rs_job: row,
@ stride, n, x or lanes, geom, X, out at offsets 0..24) and write out[0, n).

@ 4 q8 codes of two rows (words r5, r6) times 4 activations (int16: two words at r2, each loaded
@ into r3 and split, low code into r4) into r8 (row a), r9 (row b); r0 = row a's codes (the word
@ after r5), r1 = row b's offset from there; clobbers r3-r7
    .macro Q8P_STEP
    ldm r0!, {r5}
    ldr r6, [r0, r1]
    ldm r2!, {r3}
    sxth r4, r3
    sxtb r7, r5
    muls r7, r4
    add r8, r7
    sxtb r7, r6
    muls r7, r4
    add r9, r7
    asrs r3, r3, #16
    lsrs r7, r5, #8
    sxtb r7, r7
    muls r7, r3
    add r8, r7
    lsrs r7, r6, #8
    sxtb r7, r7
    muls r7, r3
    add r9, r7
    ldm r2!, {r3}
    sxth r4, r3
    lsrs r7, r5, #16
    sxtb r7, r7
    muls r7, r4
    add r8, r7
    lsrs r7, r6, #16
    sxtb r7, r7
    muls r7, r4
    add r9, r7
    asrs r3, r3, #16
    asrs r5, r5, #24
    muls r5, r3
    add r8, r5
    asrs r6, r6, #24
    muls r6, r3
    add r9, r6
    .endm


@ \row (a low register) = its row's k[], \geom -> \row = its codes, \t = pad4(ng); clobbers \t
    .macro CODES_OF row, geom, t
    uxth \t, \geom
    adds \t, #3
    lsrs \t, \t, #2
    lsls \t, \t, #2
    adds \row, \row, \t
    .endm

@ \term (a low register, a group's k * isum) added to the int32 \acc (a high register) through \t;
@ an overflow steps the row's high word at [sp, #\hi] by the term's sign (label 5 + \lab out of line:
@ OVF_STEP); clobbers \t
    .macro ACC_ADD acc, term, t, lab
    mov \t, \acc
    adds \t, \t, \term
    bvs 5\lab\()f
6\lab\():
    mov \acc, \t
    .endm

@ The out-of-line part of ACC_ADD \lab: \term's sign (-1 or +1) into [sp, #\hi]; clobbers \term, \u
    .macro OVF_STEP term, u, hi, lab
5\lab\():
    asrs \term, \term, #31
    lsls \term, \term, #1
    adds \term, #1
    ldr \u, [sp, #\hi]
    adds \u, \u, \term
    str \u, [sp, #\hi]
    b 6\lab\()b
    .endm

@ A group longer than 32 (its isum an int32, k * isum not): \acc (low word, a high register) and its
@ high word at [sp, #\hi] += \k * \isum as 64-bit integers, the product in two halves of isum (low
@ 16 bits unsigned, the rest signed: each times k an int32); clobbers \k, \th, \tl, \ta
    .macro WIDE_ADD acc, isum, k, hi, th, tl, ta
    mov \th, \isum
    uxth \tl, \th
    muls \tl, \k                @ p1 = k * the low half, 0 <= p1 < 2^24
    asrs \th, \th, #16
    muls \th, \k                @ p2 = k * the high half
    lsls \ta, \th, #16
    asrs \th, \th, #16
    adds \tl, \tl, \ta          @ the term p1 + p2 2^16: low word, C
    movs \ta, #0
    adcs \th, \ta               @ high word
    mov \ta, \acc
    asrs \k, \ta, #31
    adds \th, \th, \k
    ldr \k, [sp, #\hi]
    adds \th, \th, \k           @ + the sum's high word as two's complement (hi + the low word's sign)
    adds \ta, \ta, \tl
    movs \tl, #0
    adcs \th, \tl
    mov \acc, \ta
    asrs \tl, \ta, #31
    subs \th, \th, \tl          @ back to the high adjustment of an int32 low word
    str \th, [sp, #\hi]
    .endm

@ The pair's integer parts: r0 = row a, r1 = row b, r2 = x, r3 = geom -> r12, lr = acc of a, b
@ (low words; the high words at [sp, #16], [sp, #20]); [sp] = g, [sp, #4] = row a's codes end
@ (locals); clobbers r0-r11. r8, r9 = the group sums, r10 = the group's codes end, r11 = row a's
@ next k.
    .macro Q8P_BODY
    subs r1, r1, r0
    subs r1, #4                 @ row b's word from row a's pointer after its load
    adds r0, #4
    mov r11, r0                 @ row a's k[]
    CODES_OF r0, r3, r4
    lsrs r4, r3, #16            @ g
    str r4, [sp, #0]
    uxth r5, r3
    muls r5, r4
    adds r5, r0, r5
    str r5, [sp, #4]            @ the end of row a's codes
    adds r4, r0, r4
    mov r10, r4
    movs r4, #0
    str r4, [sp, #16]
    str r4, [sp, #20]
    mov r8, r4
    mov r9, r4
    mov r12, r4
    mov lr, r4
1:  Q8P_STEP
    Q8P_STEP
    cmp r0, r10
    bne 1b
    mov r4, r11
    ldrb r5, [r4]               @ k of row a
    adds r4, #4
    ldrb r6, [r4, r1]           @ k of row b
    subs r4, #3
    mov r11, r4
    ldr r7, [sp, #0]
    add r10, r7                 @ the next group's codes end
    cmp r7, #32
    bhi 8f                      @ a group longer than 32
    mov r7, r8
    muls r5, r7
    ACC_ADD r12, r5, r7, 1
    mov r7, r9
    muls r6, r7
    ACC_ADD lr, r6, r7, 2
9:  movs r7, #0
    mov r8, r7
    mov r9, r7
    ldr r7, [sp, #4]
    cmp r0, r7
    bne 1b
    b 7f
    OVF_STEP r5, r4, 16, 1
    OVF_STEP r6, r4, 20, 2
8:  WIDE_ADD r12, r8, r5, 16, r3, r4, r7
    WIDE_ADD lr, r9, r6, 20, r3, r4, r7
    b 9b
7:
    .endm

@ One row's integer part (the pruned head's rows, an odd last row), 16 codes a turn (a group of an
@ odd number of 8-code steps enters at the second): r0 = row, r1 = x, r2 = geom -> r9 = acc (low
@ word; the high word at [sp, #16]); clobbers r0-r8, r10-r12. r4 = codes, r5 = x, r6 = the group
@ sum, r8 = the group's codes end, r10 = the next k, r11 = g, r12 = the row's codes end.
    .macro Q8S_BODY
    adds r4, r0, #4
    mov r10, r4
    CODES_OF r4, r2, r3
    movs r5, r1
    lsrs r3, r2, #16
    mov r11, r3
    uxth r6, r2
    muls r6, r3
    adds r6, r4, r6
    mov r12, r6
    adds r3, r4, r3
    mov r8, r3
    movs r6, #0
    mov r9, r6
    str r6, [sp, #16]
1:  mov r3, r11
    lsls r3, r3, #28            @ N: bit 3 of g, an odd number of steps
    bmi 3f
2:  Q8_PAIR
3:  Q8_PAIR
    cmp r4, r8
    bne 2b
    mov r2, r10
    ldrb r3, [r2]
    adds r2, #1
    mov r10, r2
    mov r2, r11
    cmp r2, #32
    bhi 8f                      @ a group longer than 32
    muls r3, r6
    ACC_ADD r9, r3, r2, 1
9:  movs r6, #0
    add r8, r11
    cmp r4, r12
    bne 1b
    b 7f
    OVF_STEP r3, r0, 16, 1
8:  WIDE_ADD r9, r6, r3, 16, r0, r1, r2
    b 9b
7:
    .endm

@ q4, two codes a product: a word's nibbles j and j + 4 (elements j and j + 4 of its 8, each code + 8)
@ masked into the two 16-bit lanes of a register, times X_j = x_j << 16 + x_{j+4} (kernels_arch.h
@ rows_rs_lanes), put sum_j (c_j x_j + c_{j+4} x_{j+4}) in the high lane and sum_j c_j x_{j+4} in the
@ low one. Over a sub-block of 32 columns both stay below 2^15 in magnitude (|c| <= 8, |x| <= 127),
@ so the sub-block's sum is exact once the offsets' share is taken out: the sub-block's start value
@ (-8 (1 + 2^16) sum X_j, mod 2^32) does that.
@ 8 q4 codes (a word at r0) times their 4 activation pairs (at r1) into r2; r3 = 0x000F000F;
@ clobbers r4-r7
    .macro Q4L_WORD
    ldm r0!, {r4}
    ldm r1!, {r6, r7}
    movs r5, r3
    ands r5, r4
    muls r5, r6
    adds r2, r5
    lsrs r5, r4, #4
    ands r5, r3
    muls r5, r7
    adds r2, r5
    ldm r1!, {r6, r7}
    lsrs r5, r4, #8
    ands r5, r3
    muls r5, r6
    adds r2, r5
    lsrs r4, r4, #12
    ands r4, r3
    muls r4, r7
    adds r2, r4
    .endm

@ One q4 row's integer part: r0 = row, r1 = lanes, r2 = geom -> r12 = acc; clobbers r0-r11, lr.
@ r8 = a group's code bytes, r9 = its k, r10 = its codes end, r11 = the next k, lr = the row's
@ codes end. \words code words a sub-block: 4 (32 columns, groups of a multiple of 32) or 2 (16, the
@ lanes of groups of 16: a start value every 16 columns).
    .macro Q4_BODY words
    adds r0, #4
    mov r11, r0
    CODES_OF r0, r2, r3
    lsrs r4, r2, #17            @ g / 2
    mov r8, r4
    uxth r5, r2
    muls r5, r4
    adds r5, r0, r5
    mov lr, r5
    movs r2, #0
    mov r12, r2
    ldr r3, =0x000F000F
1:  mov r4, r11                 @ a group: its k, its end
    ldrb r5, [r4]
    adds r4, #1
    mov r11, r4
    mov r9, r5
    mov r4, r0
    add r4, r8
    mov r10, r4
2:  ldm r1!, {r2}               @ a sub-block
    .rept \words
    Q4L_WORD
    .endr
    sxth r5, r2                 @ the low lane
    subs r2, r2, r5
    asrs r2, r2, #16            @ the high lane: the sub-block's sum
    mov r5, r9
    muls r2, r5
    add r12, r2
    cmp r0, r10
    bne 2b
    cmp r0, lr
    bne 1b
    .endm

@ r0, r3 = acc's low word and high adjustment (acc = r0 as an int32 + r3 * 2^32; r3 = 0 unless a
@ q8 row's sum left int32), r1 = s, r2 = x -> r0 = float(acc) * (s * x), bit for bit the reference's
@ i64_to_f32(acc) * (s * x): the converter's row scales are powers of two, so s * x is x with its
@ exponent moved (exact while a normal number) and one product remains. Off the fast path (r3 not
@ 0, s not a normal power of two, s * x or the result not normal, acc 0) flm_rs_finish_slow rounds
@ float(acc) from the 64-bit integer and __aeabi_fmul makes the two products. Keeps the four on the
@ stack meanwhile (4 words: sp stays 8-aligned); clobbers r1-r7, r12, lr.
    .macro RS_FINISH
    push {r0, r1, r2, r3}
    cmp r3, #0
    bne .Lrsf_slow\@           @ the sum left int32
    lsls r3, r1, #9
    bne .Lrsf_slow\@           @ s has fraction bits
    lsls r3, r1, #1
    lsrs r3, r3, #24
    subs r3, #1
    cmp r3, #253
    bhi .Lrsf_slow\@           @ s zero, subnormal or not finite
    lsls r4, r2, #1
    lsrs r4, r4, #24
    subs r4, #1
    cmp r4, #253
    bhi .Lrsf_slow\@           @ x not normal
    adds r7, r3, r4
    subs r7, #126               @ E - 1 of s * x
    cmp r7, #253
    bhi .Lrsf_slow\@           @ s * x not normal
    eors r1, r2
    eors r1, r0
    mov r12, r1                 @ bit 31: the sign of the result
    lsls r1, r2, #9
    lsrs r1, r1, #9
    movs r3, #1
    lsls r3, r3, #23
    orrs r1, r3                 @ the significand of x, and of s * x
    asrs r3, r0, #31
    eors r0, r3
    subs r0, r0, r3             @ |acc|
    beq .Lrsf_slow\@
    movs r6, #157               @ E - 1 for a leading one at bit 31
    LEAD31 r6, r3
    lsls r3, r0, #24            @ float(acc): rounding bits, guard at bit 31
    lsrs r0, r0, #8
    lsls r3, r3, #1             @ C = guard, r3 = the rest
    bcc 7f
    bne 6f
    lsls r2, r0, #31            @ tie: to even
    beq 7f
6:  adds r0, #1
7:  lsrs r2, r0, #24
    beq 8f
    lsrs r0, r0, #1             @ rounded up to 2^24: 2^23, one binade up
    adds r6, #1
8:  adds r7, r7, r6             @ the product's exponents, as MUL_SIGS takes them
    MULCORE
    bmi 9f
    lsls r4, r4, #1
    subs r7, #1
9:  subs r7, #125
    cmp r7, #253
    bhi .Lrsf_slow\@           @ overflow or a subnormal product
    ROUND
    lsls r7, r7, #23
    adds r4, r4, r7
    mov r2, r12
    lsrs r2, r2, #31
    lsls r2, r2, #31
    orrs r4, r2
    movs r0, r4
    add sp, #16
    b .Lrsf_done\@
.Lrsf_slow\@:
    bl flm_rs_finish_slow
    add sp, #16
.Lrsf_done\@:
    .endm

@ r0, r3 = acc (RS_FINISH), r1 = row: out[0] = RS_FINISH(acc, the row's S, the job's X), out += 1
@ (the job at [sp, #8])
    .macro RS_OUT
    ldr r1, [r1]
    ldr r2, [sp, #8]
    ldr r2, [r2, #20]
    RS_FINISH
    ldr r3, [sp, #8]
    ldr r4, [r3, #24]
    stm r4!, {r0}
    str r4, [r3, #24]
    .endm

@ The job's next n rows (r4 = the job, r5 = its rows left, n of them or more): rows left -= n, r0 =
@ the first row (also at [sp, #12]), r1 = the second when n = 2; the job's row pointer moves on.
    .macro JOB_TAKE n
    subs r5, #\n
    str r5, [r4, #8]
    ldr r0, [r4, #0]
    ldr r6, [r4, #4]            @ stride
    .if \n == 2
    adds r1, r0, r6
    adds r6, r1, r6
    .else
    adds r6, r0, r6
    .endif
    str r6, [r4, #0]
    str r0, [sp, #12]
    .endm

@ A driver's entry: r4-r11 saved, 6 words of locals, the job (r0) at [sp, #8].
    .macro JOB_DRIVER name
    FUNC9 \name, 6
    str r0, [sp, #8]
    .endm

@ RS_OUT of the pass's first row ([sp, #12]) with the acc's low word in register acc, its high
@ adjustment at [sp, #16] (hi = 1) or 0 (hi = 0: q4's sums fit an int32).
    .macro PASS_OUT acc, hi
    mov r0, \acc
    ldr r1, [sp, #12]
    .if \hi
    ldr r3, [sp, #16]
    .else
    movs r3, #0
    .endif
    RS_OUT
    .endm

@ float flm_rs_scale(int32_t acc, float s, float x) = (float)acc * (s * x), RS_FINISH of an int32 acc
@ as a function (bench/kernels.py checks it against NumPy).
    .section .text.flm_rs_scale,"ax",%progbits
    .global flm_rs_scale
    .type flm_rs_scale, %function
    .thumb_func
flm_rs_scale:
    push {r3, r4, r5, r6, r7, lr}
    movs r3, #0
    RS_FINISH
    pop {r3, r4, r5, r6, r7, pc}
    .size flm_rs_scale, . - flm_rs_scale

@ RS_FINISH off its fast path, a function of its own (one copy for every RS_FINISH; in flm_rs_scale's
@ section, so in SRAM with it: streamed products run it): the four words RS_FINISH pushed (lo, s,
@ x, hi) at [sp] on entry -> r0 = i64_to_f32(lo + hi 2^32) * (s * x); clobbers r1-r7, r12
    .type flm_rs_finish_slow, %function
    .thumb_func
flm_rs_finish_slow:
    push {r4, lr}               @ (the four words now at [sp, #8]; sp stays 8-aligned)
    ldr r0, [sp, #8]
    ldr r3, [sp, #20]
    asrs r4, r0, #31
    adds r3, r3, r4             @ (r3:r0) = acc, two's complement
    asrs r5, r3, #31            @ its sign mask
    beq 41f
    negs r0, r0                 @ |acc|: C = 1 when the low word was 0
    mvns r3, r3
    movs r4, #0
    adcs r3, r4
41: movs r6, #157               @ E - 1 for a leading one at bit 31 of the low word
    movs r1, #0                 @ sticky
42: cmp r3, #0                  @ the high word shifted into the low one, at most 12 steps below 2^44
    beq 43f
    lsls r4, r0, #31
    orrs r1, r4
    lsrs r0, r0, #1
    lsls r4, r3, #31
    orrs r0, r4
    lsrs r3, r3, #1
    adds r6, #1
    b 42b
43: movs r4, #0                 @ acc 0: +0
    cmp r0, #0
    beq 44f
    LEAD31 r6, r4
    movs r4, r0
    ROUND
    lsls r6, r6, #23
    adds r4, r4, r6             @ a carry of the significand steps the exponent
    lsls r5, r5, #31
    orrs r4, r5                 @ float(acc)
44: str r4, [sp, #8]
    ldr r0, [sp, #12]
    ldr r1, [sp, #16]
    bl __aeabi_fmul             @ s * x
    movs r1, r0
    ldr r0, [sp, #8]
    bl __aeabi_fmul
    pop {r4, pc}
    .size flm_rs_finish_slow, . - flm_rs_finish_slow

@ void flm_rs_rows_q8_m0(flm_rs_job *j): two rows a pass (each activation word loaded and
@ split once for both), an odd last one alone. Locals: [sp] = g, [sp, #4] = codes end (Q8P_BODY),
@ [sp, #8] = the job, [sp, #12] = the pass's first row, [sp, #16], [sp, #20] = the high words of
@ its rows' sums.
    JOB_DRIVER flm_rs_rows_q8_m0
20: ldr r4, [sp, #8]
    ldr r5, [r4, #8]            @ rows left
    cmp r5, #1
    blo 23f
    beq 24f
    b 21f                       @ (the blocks are beyond a conditional branch's reach)
24: b 22f
23: LEAVE9 6
21: JOB_TAKE 2                  @ a pair
    ldr r2, [r4, #12]
    ldr r3, [r4, #16]
    Q8P_BODY
    mov r11, lr                 @ row b's acc (RS_FINISH may call out)
    PASS_OUT r12, 1
    ldr r3, [sp, #8]
    ldr r1, [sp, #12]
    ldr r3, [r3, #4]
    adds r1, r1, r3             @ row b
    mov r0, r11
    ldr r3, [sp, #20]
    RS_OUT
    b 20b
22: movs r5, #0                 @ the last row
    str r5, [r4, #8]
    ldr r0, [r4, #0]
    str r0, [sp, #12]
    ldr r1, [r4, #12]
    ldr r2, [r4, #16]
    Q8S_BODY
    PASS_OUT r9, 1
    b 20b
    .size flm_rs_rows_q8_m0, . - flm_rs_rows_q8_m0

@ void flm_rs_rows_q4_m0(flm_rs_job *j): j->x is the lanes (kernels_arch.h rows_rs_lanes), sub-blocks
@ of 32 columns; flm_rs_rows_q4h_m0 the same for groups of 16 (sub-blocks of 16). Locals as above.
    .macro Q4_ROWS name, words
    JOB_DRIVER \name
20: ldr r4, [sp, #8]
    ldr r5, [r4, #8]
    cmp r5, #0
    bne 21f
    LEAVE9 6
21: JOB_TAKE 1
    ldr r1, [r4, #12]
    ldr r2, [r4, #16]
    Q4_BODY \words
    PASS_OUT r12, 0
    b 20b
    .ltorg
    .size \name, . - \name
    .endm
    Q4_ROWS flm_rs_rows_q4_m0, 4
    Q4_ROWS flm_rs_rows_q4h_m0, 2

@ ---- four tokens' row-scaled q8 rows (a pass of several tokens: kernels_arch.h flm_rs_staged_rows): each
@ code word loaded and each code sign-extended once for four tokens, whose activation codes are
@ staged interleaved (kernels_arch.h flm_rs_stage: per column two words, token 0 | token 1 << 16 and
@ token 2 | token 3 << 16). Per token the sums are Q8S_BODY's (the same group sums, each group's term
@ k * isum added with the overflow test to an int64 kept as an int32 and a high word), the finish
@ RS_FINISH's: each token's out[] is bit for bit flm_rs_rows_q8_m0's. Groups of 16 or 32 codes (16
@ a turn of the loop; a term fits an int32). Where the single-token loop takes 41 cycles for 8
@ products, this one takes 68 for 16, and 60 from a stage of int32 activations (four words a
@ column: flm_rs_rows4w_q8_m0, where twice the stage fits).
@ void flm_rs_rows4_q8_m0(flm_rs_job4 *j), flm_rs_rows4w_q8_m0: softfloat_m0.h's job: row 0,
@ stride 4, n 8, x 12, geom 16, xs[4] at 20, out[4] at 36.

@ One column's four activations times the code in r7 into r8-r11: \wide 0, two words at r2 (int16
@ pairs), 1, four (int32: no sign extension, twice the stage); clobbers r3-r6
    .macro Q8Q_COL wide
    .if \wide
    ldm r2!, {r3, r4, r5, r6}
    muls r3, r7
    add r8, r3
    muls r4, r7
    add r9, r4
    muls r5, r7
    add r10, r5
    muls r6, r7
    add r11, r6
    .else
    ldm r2!, {r3, r4}
    sxth r5, r3
    asrs r3, r3, #16
    sxth r6, r4
    asrs r4, r4, #16
    muls r5, r7
    add r8, r5
    muls r3, r7
    add r9, r3
    muls r6, r7
    add r10, r6
    muls r4, r7
    add r11, r4
    .endif
    .endm

    .macro Q8Q_WORD wide
    ldm r0!, {r1}
    sxtb r7, r1
    Q8Q_COL \wide
    lsrs r7, r1, #8
    sxtb r7, r7
    Q8Q_COL \wide
    lsrs r7, r1, #16
    sxtb r7, r7
    Q8Q_COL \wide
    asrs r7, r1, #24
    Q8Q_COL \wide
    .endm

@ Token \t's group term, the k in r7 times its group sum (\isum, a high register), added to its sum
@ at [sp, #4 * \t] (an overflow steps its high word at [sp, #16 + 4 * \t]: label 5\t out of line,
@ Q8Q_OVF); clobbers r3, r4
    .macro Q8Q_ACC isum, t
    mov r3, \isum
    muls r3, r7
    ldr r4, [sp, #(4 * \t)]
    adds r4, r4, r3
    bvs 5\t\()f
6\t\():
    str r4, [sp, #(4 * \t)]
    .endm

    .macro Q8Q_OVF t
5\t\():
    asrs r3, r3, #31
    lsls r3, r3, #1
    adds r3, #1                 @ the term's sign, -1 or +1
    ldr r5, [sp, #(16 + 4 * \t)]
    adds r5, r5, r3
    str r5, [sp, #(16 + 4 * \t)]
    b 6\t\()b
    .endm

@ Locals: [sp, #0..12] the four sums' low words, [sp, #16..28] their high words, [sp, #32] the job,
@ [sp, #36] the row, [sp, #40] its next k, [sp, #44] its codes' end, [sp, #48] a group's code bytes,
@ 15 words with ENTER9's 9 keep sp 8-byte aligned (flm_rs_rows4_q4_m0's too).
@ A four-token driver's entry and its row: \name entered with 15 words of locals, the job at [sp, #32];
@ label 20 takes the job's next row (none left: returns) -> r0 = its codes, r2 = the staged
@ activations, the locals set for it ([sp, #48] = a group's code bytes: g, or g / 2 for \q4), the
@ sums 0; clobbers r3-r6
    .macro ROWS4_ROW name, q4
    FUNC9 \name, 15
    str r0, [sp, #32]
20: ldr r4, [sp, #32]
    ldr r5, [r4, #8]            @ rows left
    cmp r5, #0
    bne 21f
    LEAVE9 15
21: subs r5, #1
    str r5, [r4, #8]
    ldr r0, [r4, #0]            @ the row
    ldr r6, [r4, #4]
    adds r6, r0, r6
    str r6, [r4, #0]
    str r0, [sp, #36]
    ldr r2, [r4, #12]           @ the staged activations
    ldr r3, [r4, #16]           @ geom
    adds r0, #4
    str r0, [sp, #40]           @ k[]
    CODES_OF r0, r3, r4
    lsrs r4, r3, #(16 + \q4)     @ a group's code bytes
    str r4, [sp, #48]
    uxth r5, r3
    muls r5, r4
    adds r5, r0, r5
    str r5, [sp, #44]           @ the end of the row's codes
    movs r4, #0
    str r4, [sp, #0]
    str r4, [sp, #4]
    str r4, [sp, #8]
    str r4, [sp, #12]
    str r4, [sp, #16]
    str r4, [sp, #20]
    str r4, [sp, #24]
    str r4, [sp, #28]
    .endm

@ The row's four outputs from its sums (low words [sp, #0..12], high words [sp, #16..28]), then the
@ next row (label 20)
    .macro ROWS4_OUT
    ldr r1, [sp, #36]           @ r8 = the job + 4t, r9 = &sum[t],
    ldr r1, [r1]                @ r10 = S, r11 = the job + 16 (RS_FINISH keeps r8-r11)
    mov r10, r1
    ldr r6, [sp, #32]
    mov r8, r6
    adds r6, #16
    mov r11, r6
    mov r5, sp
    mov r9, r5
25: mov r5, r9
    ldm r5!, {r0}               @ the sum's low word
    ldr r3, [r5, #12]           @ its high word
    mov r9, r5
    mov r1, r10
    mov r6, r8
    ldr r2, [r6, #20]           @ the token's X
    RS_FINISH
    mov r6, r8
    ldr r5, [r6, #36]
    stm r5!, {r0}
    str r5, [r6, #36]
    adds r6, #4
    mov r8, r6
    cmp r6, r11
    beq 27f
    b 25b
27: b 20b
    .endm

    .macro ROWS4 name, wide
    ROWS4_ROW \name, 0
22: ldr r4, [sp, #48]           @ a group: its codes' end, its sums
    adds r4, r0, r4
    mov r12, r4
    movs r4, #0
    mov r8, r4
    mov r9, r4
    mov r10, r4
    mov r11, r4
23: Q8Q_WORD \wide
    Q8Q_WORD \wide
    Q8Q_WORD \wide
    Q8Q_WORD \wide
    cmp r0, r12
    beq 24f
    b 23b                       @ (the loop is beyond a conditional branch's reach)
24: ldr r1, [sp, #40]
    ldrb r7, [r1]               @ the group's k
    adds r1, #1
    str r1, [sp, #40]
    Q8Q_ACC r8, 0
    Q8Q_ACC r9, 1
    Q8Q_ACC r10, 2
    Q8Q_ACC r11, 3
    ldr r1, [sp, #44]
    cmp r0, r1
    beq 26f
    b 22b
    Q8Q_OVF 0
    Q8Q_OVF 1
    Q8Q_OVF 2
    Q8Q_OVF 3
26: ROWS4_OUT
    .size \name, . - \name
    .endm

    ROWS4 flm_rs_rows4_q8_m0, 0
    ROWS4 flm_rs_rows4w_q8_m0, 1

@ ---- four tokens' row-scaled q4 rows (a pass of several tokens): each code word loaded and each
@ nibble pair masked once for four tokens, whose lanes (Q4L_WORD's X_j) are staged interleaved
@ (kernels_arch.h flm_rs_stage: per sub-block of 32 columns the four tokens' start values, then per
@ lane word the four tokens' words). A token's sub-block sum is Q4L_WORD's, its start value biased by
@ 2^15 so that the high lane is (sum + 2^15) >> 16 without the low one's SXTH (|low lane| < 2^15);
@ each group's k times it added to the token's int32 row sum, the finish RS_FINISH's: each token's
@ out[] is bit for bit flm_rs_rows_q4_m0's. 66 cycles per code word for four tokens where the one-token
@ loop takes 24 for one. void flm_rs_rows4_q4_m0(flm_rs_job4 *j): as flm_rs_rows4_q8_m0's job.

@ Nibbles j and j + 4 of the code word r4 (\sh = 4j: r2 = them masked by r3 = 0x000F000F) times the
@ four tokens' X_j (at r1) into r8-r11; clobbers r2, r5-r7
    .macro Q4Q_PAIR sh
    .if \sh
    lsrs r2, r4, #\sh
    ands r2, r3
    .else
    movs r2, r3
    ands r2, r4
    .endif
    ldm r1!, {r5, r6, r7}
    muls r5, r2
    add r8, r5
    muls r6, r2
    add r9, r6
    muls r7, r2
    add r10, r7
    ldm r1!, {r5}
    muls r5, r2
    add r11, r5
    .endm

    .macro Q4Q_WORD
    ldm r0!, {r4}
    Q4Q_PAIR 0
    Q4Q_PAIR 4
    Q4Q_PAIR 8
    Q4Q_PAIR 12
    .endm

@ Token \t's sub-block sum (the high lane of \acc) times the group's k (r2) added to its row sum at
@ [sp, #4 * \t]; clobbers r4, r5
    .macro Q4Q_ACC acc, t
    mov r4, \acc
    asrs r4, r4, #16
    muls r4, r2
    ldr r5, [sp, #(4 * \t)]
    adds r5, r5, r4
    str r5, [sp, #(4 * \t)]
    .endm

@ \name's rows, \words code words a sub-block (Q4_BODY's)
    .macro Q4Q_ROWS name, words
    ROWS4_ROW \name, 1
    mov r1, r2
    movs r3, #15
    lsls r4, r3, #16
    orrs r3, r4                 @ 0x000F000F
22: ldr r4, [sp, #40]           @ a group: its k (lr), its codes' end (r12)
    ldrb r2, [r4]
    adds r4, #1
    str r4, [sp, #40]
    mov lr, r2
    ldr r4, [sp, #48]
    adds r4, r0, r4
    mov r12, r4
23: ldm r1!, {r4, r5, r6, r7}   @ a sub-block: the tokens' start values
    mov r8, r4
    mov r9, r5
    mov r10, r6
    mov r11, r7
    .rept \words
    Q4Q_WORD
    .endr
    mov r2, lr
    Q4Q_ACC r8, 0
    Q4Q_ACC r9, 1
    Q4Q_ACC r10, 2
    Q4Q_ACC r11, 3
    cmp r0, r12
    beq 24f
    b 23b                       @ (the loop is beyond a conditional branch's reach)
24: ldr r4, [sp, #44]
    cmp r0, r4
    beq 26f
    b 22b
26: ROWS4_OUT
    .size \name, . - \name
    .endm
    Q4Q_ROWS flm_rs_rows4_q4_m0, 4
    Q4Q_ROWS flm_rs_rows4_q4h_m0, 2

@ ---- float __aeabi_fdiv(float a, float b) -----------------------------------------------
@ Normal operands and a normal quotient: 25 quotient bits by restoring division (the carry of
@ each compare-and-subtract is the next bit), the remainder as the sticky bit; the rest goes to
@ flm_sf_div (softfloat.c).
    .section .text.__aeabi_fdiv,"ax",%progbits
    .global __aeabi_fdiv
    .type __aeabi_fdiv, %function
.Ldiv_range:                    @ before the entry: the conditional branches reach it
    pop {r0, r1, r4}
    pop {r3}
    mov lr, r3
.Ldiv_slow:
    ldr r3, =flm_sf_div
    bx r3
    .thumb_func
__aeabi_fdiv:
    lsls r2, r0, #1
    lsrs r2, r2, #24
    subs r2, #1
    cmp r2, #253
    bhi .Ldiv_slow              @ a not normal
    lsls r3, r1, #1
    lsrs r3, r3, #24
    subs r3, #1
    cmp r3, #253
    bhi .Ldiv_slow              @ b not normal
    push {r0, r1, r4, lr}
    subs r2, r2, r3
    adds r2, #126               @ E - 1 for a quotient in [1, 2)
    movs r4, #1
    lsls r4, r4, #23
    lsls r0, r0, #9
    lsrs r0, r0, #9
    orrs r0, r4                 @ ma
    lsls r1, r1, #9
    lsrs r1, r1, #9
    orrs r1, r4                 @ mb
    cmp r0, r1
    bhs 1f
    lsls r0, r0, #1             @ ma < mb: the quotient's leading one comes a bit later
    subs r2, #1
1:  cmp r2, #253
    bhi .Ldiv_range             @ overflow or a subnormal quotient
    movs r4, #0
    .rept 25
    cmp r0, r1
    bcc 2f
    subs r0, r0, r1             @ C = 1: no borrow
2:  adcs r4, r4                 @ q = 2q + C
    lsls r0, r0, #1
    .endr
    lsrs r3, r4, #1             @ 24-bit significand; C = guard
    bcc 4f
    cmp r0, #0
    bne 3f                      @ remainder: above the halfway point
    lsls r4, r3, #31            @ tie: round to even
    beq 4f
3:  adds r3, #1
4:  lsls r2, r2, #23
    adds r3, r3, r2             @ a carry of the significand steps the exponent
    ldr r0, [sp, #0]
    ldr r1, [sp, #4]
    eors r0, r1
    lsrs r0, r0, #31
    lsls r0, r0, #31
    orrs r0, r3
    add sp, #8
    pop {r4, pc}
    .size __aeabi_fdiv, . - __aeabi_fdiv

@ ---- the engine's float loops (flm_math.h): each element's product and sum as __aeabi_fmul and
@ __aeabi_fadd form them, in the same order, with fmul's fast path inline: the compiled loops spent
@ a quarter of a pair's cycles on the calls and their register saves.
@ r0 * r1 -> r0 as __aeabi_fmul; r10, r11 keep the operands for flm_sf_mul, which takes every case
@ off the fast path (here also the out-of-range products); clobbers r1-r5, r12, lr
    .macro MULF
    mov r10, r0
    mov r11, r1
    lsls r2, r0, #1
    lsrs r2, r2, #24
    subs r2, #1
    cmp r2, #253
    bhi 7f                      @ a not normal
    lsls r3, r1, #1
    lsrs r3, r3, #24
    subs r3, #1
    cmp r3, #253
    bhi 7f                      @ b not normal
    adds r3, r2, r3
    movs r2, r0
    eors r2, r1
    mov r12, r2
    MUL_SIGS r3
    cmp r3, #253
    bhi 7f                      @ overflow or a subnormal product
    ROUND
    lsls r3, r3, #23
    adds r4, r4, r3
    mov r2, r12
    lsrs r2, r2, #31
    lsls r2, r2, #31
    orrs r4, r2
    movs r0, r4
    b 8f
7:  mov r0, r10
    mov r1, r11
    bl flm_sf_mul
8:
    .endm

@ float flm_dot_f32(const float *a, const float *b, uint32_t n), n >= 1:
@ a[0] * b[0], then s = s + a[i] * b[i] for i = 1..n-1
    FUNC9 flm_dot_f32, 1  @ (a word of pad: the stack stays 8-byte aligned for the calls)
    movs r6, r0
    movs r7, r1
    lsls r2, r2, #2
    adds r2, r0, r2
    mov r8, r2                  @ the end of a
    ldm r6!, {r0}
    ldm r7!, {r1}
    MULF
    b 5f
6:  ldm r6!, {r0}
    ldm r7!, {r1}
    MULF
    movs r1, r0
    mov r0, r9
    bl __aeabi_fadd
5:  mov r9, r0                  @ s
    cmp r6, r8
    bne 6b
    mov r0, r9
    LEAVE9 1
    .size flm_dot_f32, . - flm_dot_f32

@ void flm_axpy_f32(float *o, float a, const float *v, uint32_t n), n >= 1: o[i] = o[i] + a * v[i]
    FUNC9 flm_axpy_f32, 1  @ (a word of pad: the stack stays 8-byte aligned for the calls)
    movs r6, r0
    movs r7, r2
    mov r9, r1                  @ a
    lsls r3, r3, #2
    adds r3, r0, r3
    mov r8, r3                  @ the end of o
6:  mov r0, r9
    ldm r7!, {r1}
    MULF
    movs r1, r0
    ldr r0, [r6]
    bl __aeabi_fadd
    stm r6!, {r0}
    cmp r6, r8
    bne 6b
    LEAVE9 1
    .size flm_axpy_f32, . - flm_axpy_f32

@ kernels.c flm_quantize_act's codes of one group, q[i] = code(x[i] * inv): the product as
@ __aeabi_fmul forms it, then NaN -> 0, beyond qmax -> +-qmax, else round_half_away (flm_math.h);
@ n >= 1. inv (positive: qmax / amax) is unpacked once; a normal x with a normal product takes
@ __aeabi_fmul's fast path inline on the unpacked operands (MULCORE, ROUND) and its code from the
@ rounded significand, as the bits would give it; anything else calls __aeabi_fmul and takes the
@ code from the product's bits.
@ void flm_quant_codes_m0(const float *x, uint32_t n, float inv, int8_t *q): int8 codes, qmax 127
@ void flm_act_codes_m0(const float *x, uint32_t n, float inv, int16_t *q, int32_t qmax): int16 codes
@ Registers: r6 = x, r7 = q, r8 = the end of x, r9 = inv, r10 = its exponent field - 1 (4096 when
@ inv is not a positive normal number: every product off the fast path), r11 = its significand,
@ r12 = x while its product is made, lr = 2^23 (the hidden bit). Locals: [sp] = the bits of
@ (float)qmax, [sp, #4] = qmax (and a word of pad: the stack stays 8-byte aligned for the calls).
    .macro QUANT name, size
    FUNC9 \name, 3
    movs r6, r0                 @ x
    movs r7, r3                 @ q
    mov r9, r2                  @ inv
    lsls r1, r1, #2
    adds r1, r0, r1
    mov r8, r1                  @ the end of x
    .if \size == 1
    movs r0, #127
    str r0, [sp, #4]
    ldr r0, =0x42fe0000         @ 127.0f
    .else
    ldr r0, [sp, #48]           @ qmax, the fifth argument (above the 12 words)
    str r0, [sp, #4]
    movs r2, #157               @ (float)qmax, exact (qmax < 2^24): E - 1 for a leading one at bit 31
    LEAD31 r2, r3
    lsrs r0, r0, #8
    lsls r2, r2, #23
    adds r0, r0, r2             @ the hidden bit steps the exponent field to E
    .endif
    str r0, [sp, #0]
    mov r2, r9
    lsls r3, r2, #1
    lsrs r3, r3, #24
    subs r3, #1                 @ inv's exponent field - 1
    cmp r2, #0
    blt 10f                     @ negative (never from flm_quantize_act)
    cmp r3, #253
    bls 11f
10: movs r3, #1
    lsls r3, r3, #12            @ not a positive normal number: 4096 fails every product's test
11: mov r10, r3
    movs r0, #1
    lsls r0, r0, #23
    mov lr, r0
    lsls r1, r2, #9
    lsrs r1, r1, #9
    orrs r1, r0
    mov r11, r1                 @ inv's significand
6:  ldm r6!, {r0}               @ x (labels 1-3 are MULCORE's and ROUND's)
    mov r12, r0
    lsls r3, r0, #1
    lsrs r3, r3, #24
    subs r3, #1
    cmp r3, #253
    bhi 20f                     @ x not normal
    lsls r0, r0, #9
    lsrs r0, r0, #9
    mov r1, lr
    orrs r0, r1                 @ x's significand
    add r3, r10                 @ (ex - 1) + (einv - 1)
    mov r1, r11
    MULCORE
    bmi 12f
    lsls r4, r4, #1             @ product in [1, 2): one bit more
    subs r3, #1
12: subs r3, #125               @ E - 1 of the product
    cmp r3, #253
    bhi 20f                     @ overflow or a subnormal product
    ROUND
    lsls r1, r3, #23
    adds r1, r1, r4             @ |v|'s bits (a rounding carry steps the exponent)
    mov r0, r12                 @ v's sign, x's (inv > 0)
    ldr r2, [sp, #0]
    cmp r1, r2
    bhi 5f                      @ beyond qmax
    movs r2, #0x3f
    lsls r2, r2, #24            @ 0.5f
    cmp r1, r2
    blo 4f
    movs r2, #148               @ v in [0.5, qmax]: floor(2v) = the significand >> (148 - (E - 1)),
    subs r2, r2, r3             @ plus one, halved
    lsrs r4, r2
    adds r4, #1
    lsrs r4, r4, #1
7:  cmp r0, #0                  @ the sign of v
    bge 8f
    negs r4, r4
8:
    .if \size == 1
    strb r4, [r7]
    .else
    strh r4, [r7]
    .endif
    adds r7, #\size
    cmp r6, r8
    bne 6b
    LEAVE9 3
4:  ldr r3, =0x3effffff         @ below 0.5: only the float just below it rounds up (fl(v + 0.5) = 1)
    movs r4, #0
    cmp r1, r3
    bne 7b
    movs r4, #1
    b 7b
5:  ldr r4, [sp, #4]            @ beyond qmax: +-qmax, NaN: 0
    movs r3, #255
    lsls r3, r3, #23
    cmp r1, r3
    bls 7b
    movs r4, #0
    b 7b
20: mov r0, r12                 @ off the fast path: __aeabi_fmul, the code from the product's bits
    mov r1, r9
    bl __aeabi_fmul
    movs r1, #1
    lsls r1, r1, #23
    mov lr, r1                  @ (the call's return address was lr)
    lsls r1, r0, #1
    lsrs r1, r1, #1             @ |v|
    ldr r3, [sp, #0]
    cmp r1, r3
    bhi 5b
    movs r3, #0x3f
    lsls r3, r3, #24            @ 0.5f
    cmp r1, r3
    blo 4b
    lsrs r3, r1, #23            @ v in [0.5, qmax]: floor(2v) from the significand, plus one, halved
    lsls r4, r1, #8
    movs r2, #1
    lsls r2, r2, #31
    orrs r4, r2
    movs r2, #157
    subs r2, r2, r3
    lsrs r4, r2
    adds r4, #1
    lsrs r4, r4, #1
    b 7b
    .ltorg
    .size \name, . - \name
    .endm

    QUANT flm_quant_codes_m0, 1
    QUANT flm_act_codes_m0, 2

@ The two dots' function name(a, b, x, n, out): r8, r9 the sums, two steps a turn (each STEP's codes
@ from a and from b at r1 past it) until a's end, n codes of 2^size bytes.
    .macro DOT2 name, step, size
    FUNC9 \name, 0
    subs r1, r1, r0
    subs r1, #4                 @ b's word from a's pointer after its load
    .if \size
    lsls r3, r3, #\size
    .endif
    adds r3, r0, r3
    mov r10, r3                 @ the end of a
    movs r4, #0
    mov r8, r4
    mov r9, r4
1:  \step
    \step
    cmp r0, r10
    bne 1b
    ldr r4, [sp, #36]           @ out, the fifth argument (above the 9 saved words)
    mov r5, r8
    str r5, [r4, #0]
    mov r5, r9
    str r5, [r4, #4]
    LEAVE9 0
    .size \name, . - \name
    .endm

@ ---- the int8 attention's integer loops (engine.c attend_int8_head) ------------------------

@ void flm_dot2_q8_m0(const int8_t *a, const int8_t *b, const int16_t *x, uint32_t n, int32_t out[2]):
@ two dots sharing x (two positions' int8 keys against a query's codes), n a multiple of 8,
@ word-aligned.
    DOT2 flm_dot2_q8_m0, Q8P_STEP, 0

@ 2 int16 codes of two rows (words r5, r6) times 2 activations (word r3, low code into r4) into r8
@ (row a), r9 (row b); r0 = row a's codes (the word after r5), r1 = row b's offset from there;
@ clobbers r3-r7
    .macro Q12P_STEP
    ldm r0!, {r5}
    ldr r6, [r0, r1]
    ldm r2!, {r3}
    sxth r4, r3
    sxth r7, r5
    muls r7, r4
    add r8, r7
    sxth r7, r6
    muls r7, r4
    add r9, r7
    asrs r3, r3, #16
    asrs r5, r5, #16
    muls r5, r3
    add r8, r5
    asrs r6, r6, #16
    muls r6, r3
    add r9, r6
    .endm

@ void flm_dot2_q12_m0(const int16_t *a, const int16_t *b, const int16_t *x, uint32_t n, int32_t out[2]):
@ the k12 attention's two dots sharing x (two positions' int16 keys against a query's codes; int32
@ sums: |c| <= 2047, n <= 512), n a multiple of 4, word-aligned.
    DOT2 flm_dot2_q12_m0, Q12P_STEP, 1

@ void flm_axpy_q8_m0(int32_t *acc, const int8_t *v, int32_t w, uint32_t n): acc[i] += w * v[i],
@ n a multiple of 4, word-aligned: a word of codes, two sums at a time.
    .section .text.flm_axpy_q8_m0,"ax",%progbits
    .global flm_axpy_q8_m0
    .type flm_axpy_q8_m0, %function
    .thumb_func
flm_axpy_q8_m0:
    push {r4, r5, r6, lr}
    lsls r3, r3, #2
    adds r3, r0, r3
    mov r12, r3                 @ the end of acc
1:  ldm r1!, {r3}
    ldm r0!, {r5, r6}
    sxtb r4, r3
    muls r4, r2
    adds r5, r4
    lsls r4, r3, #16
    asrs r4, r4, #24
    muls r4, r2
    adds r6, r4
    subs r0, #8
    stm r0!, {r5, r6}
    ldm r0!, {r5, r6}
    lsls r4, r3, #8
    asrs r4, r4, #24
    muls r4, r2
    adds r5, r4
    asrs r4, r3, #24
    muls r4, r2
    adds r6, r4
    subs r0, #8
    stm r0!, {r5, r6}
    cmp r0, r12
    bne 1b
    pop {r4, r5, r6, pc}
    .size flm_axpy_q8_m0, . - flm_axpy_q8_m0
