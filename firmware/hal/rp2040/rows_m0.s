@ Whole matvec rows for the Cortex-M0+ (ARMv6-M Thumb): kernels.c row_whole's loop (f32 scales,
@ groups of a multiple of 8 codes, word-aligned activations) with its group dots inline and the
@ group loop in registers. Compiled C spills that loop's state around the inline dot (~50 cycles a
@ group, as much as a quarter of a q8 group's dot). The sums, terms and adds are kernels.c's, in
@ its order: each group's integer dot, flm_group_term(isum, scale, xs[gi]) (softfloat_m0.s), the
@ first term as the row's value and every later one added by __aeabi_fadd(acc, term); the boot
@ self-check (kernels.c flm_kernels_self_check) compares these rows with the scalar kernels'.
@
@ float flm_row_q8_m0(const uint8_t *p, const int8_t *x, const float *xs, uint32_t ng, uint32_t code_bytes)
@ float flm_row_q4_m0(...): the same for 4-bit codes (code_bytes = g / 2)
@ Registers: r4 = p (scale, then codes), r5 = x, r6 = the group's integer sum, r7 = the end of its
@ codes; r8 = code_bytes, r9 = the row's value so far, r10 = &xs[gi], r11 = &xs[ng]; r12 = scale.

    .syntax unified
    .cpu cortex-m0plus
    .thumb

@ 4 q8 codes (word r0) times 4 activations (word r1) into r6; clobbers r0-r3; Q8_PAIR: 8 of them
    .macro Q8_WORD
    ldm r4!, {r0}
    ldm r5!, {r1}
    sxtb r2, r0
    sxtb r3, r1
    muls r2, r3
    adds r6, r2
    lsrs r2, r0, #8
    sxtb r2, r2
    lsrs r3, r1, #8
    sxtb r3, r3
    muls r2, r3
    adds r6, r2
    lsrs r2, r0, #16
    sxtb r2, r2
    lsrs r3, r1, #16
    sxtb r3, r3
    muls r2, r3
    adds r6, r2
    asrs r0, r0, #24
    asrs r1, r1, #24
    muls r0, r1
    adds r6, r0
    .endm

    .macro Q8_PAIR
    Q8_WORD
    Q8_WORD
    .endm

@ q4: a nibble (word r0, bits \sh..\sh+3 after LSLS #\sh) times r3 into r6; clobbers r2
    .macro Q4_NIB sh
    lsls r2, r0, #\sh
    asrs r2, r2, #28
    muls r2, r3
    adds r6, r2
    .endm

@ 8 q4 codes (word r0, low nibble first) times 8 activations (two words) into r6; clobbers r0-r3
    .macro Q4_WORD
    ldm r4!, {r0}
    ldm r5!, {r1}
    sxtb r3, r1
    Q4_NIB 28
    lsrs r3, r1, #8
    sxtb r3, r3
    Q4_NIB 24
    lsrs r3, r1, #16
    sxtb r3, r3
    Q4_NIB 20
    asrs r3, r1, #24
    Q4_NIB 16
    ldm r5!, {r1}
    sxtb r3, r1
    Q4_NIB 12
    lsrs r3, r1, #8
    sxtb r3, r3
    Q4_NIB 8
    lsrs r3, r1, #16
    sxtb r3, r3
    Q4_NIB 4
    asrs r0, r0, #28
    asrs r1, r1, #24
    muls r0, r1
    adds r6, r0
    .endm

@ One group: its scale, its dot (8 codes a turn), its term in r0
    .macro GROUP step
    ldm r4!, {r0}
    mov r12, r0
    mov r7, r8
    adds r7, r4, r7
    movs r6, #0
1:  \step
    cmp r4, r7
    bne 1b
    movs r0, r6
    mov r1, r12
    mov r3, r10
    ldm r3!, {r2}
    mov r10, r3
    bl flm_group_term
    .endm

    .macro ROW name, step
    .section .text.\name,"ax",%progbits
    .global \name
    .type \name, %function
    .thumb_func
\name:
    push {r4, r5, r6, r7, lr}
    mov r4, r8
    mov r5, r9
    mov r6, r10
    mov r7, r11
    push {r3, r4, r5, r6, r7}   @ r3 only keeps the stack 8-byte aligned for the calls
    ldr r4, [sp, #40]           @ code_bytes, above the 10 words pushed
    mov r8, r4
    lsls r3, r3, #2
    adds r3, r2, r3
    mov r11, r3
    mov r10, r2
    movs r4, r0
    movs r5, r1
    GROUP \step
    mov r9, r0                  @ the first term is the row's value (0 + term would turn -0 into +0)
    b 3f
2:  GROUP \step
    movs r1, r0
    mov r0, r9
    bl __aeabi_fadd
    mov r9, r0
3:  cmp r10, r11
    bne 2b
    mov r0, r9
    pop {r3, r4, r5, r6, r7}
    mov r8, r4
    mov r9, r5
    mov r10, r6
    mov r11, r7
    pop {r4, r5, r6, r7, pc}
    .size \name, . - \name
    .endm

    ROW flm_row_q8_m0, Q8_PAIR
    ROW flm_row_q4_m0, Q4_WORD
