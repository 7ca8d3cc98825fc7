/* Start-up and vectors of the ESP32-S3-ISA board on QEMU's Xtensa sim machine (core de233_fpu:
 * LX7, windowed registers, XEA2 exceptions; the ESP32-S3's LX7 has the same vector offsets).
 *
 * QEMU's sim machine starts the core at its reset vector, 0xfe000000 (the core's
 * XCHAL_RESET_VECTOR0_VADDR, in the machine's ROM), not at the ELF's entry: .reset holds a jump
 * from there to flm_xt_start. flm_xt_start points VECBASE at the vectors below, enables the FPU
 * (coprocessor 0: CPENABLE bit 0, else every float instruction faults), resets the register
 * window to one live frame, sets the stack pointer and PS (WOE: window overflow exceptions on;
 * UM: exceptions go to the user vector; EXCM 0; interrupts are never enabled), clears .bss and
 * calls main with call4 (the start frame then only needs a0-a3 spilled, into the 16 bytes below
 * main's stack pointer).
 *
 * The window vectors implement the windowed ABI's spill and refill of a caller's registers as the
 * Xtensa ISA reference manual defines them (section "Windowed Procedure-Call Protocol"): a frame's
 * a0-a3 live in the 16 bytes below its callee's stack pointer (reached through a5, a9 or a13 of
 * the frame being spilled, the callee's a1 for call4, call8 or call12), its a4-a7 (call8) or
 * a4-a11 (call12) below the stack pointer of its own caller, minus the caller's 16-byte area
 * (that pointer is the a1 saved in the base area of the frame below, read through a1 - 12).
 *
 * Any other exception (an illegal instruction, an unaligned or prohibited access, an integer
 * division by zero ...) goes to flm_xt_fault: it keeps only the current window (nothing is ever
 * returned to), moves to a stack of its own and calls hal_qemu_xtensa.c's report, which ends QEMU
 * with exit status 100 + EXCCAUSE. */

    .section .reset, "ax"
    .global flm_xt_reset
flm_xt_reset:
    j 1f
    .p2align 2
2:  .4byte flm_xt_start
1:  l32r a2, 2b
    jx a2

    .section .vectors, "ax"
    .p2align 12
    .global flm_xt_vectors
flm_xt_vectors:
    .org 0x00                   /* WindowOverflow4 */
    s32e a0, a5, -16
    s32e a1, a5, -12
    s32e a2, a5, -8
    s32e a3, a5, -4
    rfwo
    .org 0x40                   /* WindowUnderflow4 */
    l32e a0, a5, -16
    l32e a1, a5, -12
    l32e a2, a5, -8
    l32e a3, a5, -4
    rfwu
    .org 0x80                   /* WindowOverflow8 */
    s32e a0, a9, -16
    l32e a0, a1, -12            /* the caller's stack pointer */
    s32e a1, a9, -12
    s32e a2, a9, -8
    s32e a3, a9, -4
    s32e a4, a0, -32
    s32e a5, a0, -28
    s32e a6, a0, -24
    s32e a7, a0, -20
    rfwo
    .org 0xc0                   /* WindowUnderflow8 */
    l32e a1, a9, -12
    l32e a0, a9, -16
    l32e a7, a1, -12            /* the caller's stack pointer */
    l32e a2, a9, -8
    l32e a4, a7, -32
    l32e a3, a9, -4
    l32e a5, a7, -28
    l32e a6, a7, -24
    l32e a7, a7, -20
    rfwu
    .org 0x100                  /* WindowOverflow12 */
    s32e a0, a13, -16
    l32e a0, a1, -12
    s32e a1, a13, -12
    s32e a2, a13, -8
    s32e a3, a13, -4
    s32e a4, a0, -48
    s32e a5, a0, -44
    s32e a6, a0, -40
    s32e a7, a0, -36
    s32e a8, a0, -32
    s32e a9, a0, -28
    s32e a10, a0, -24
    s32e a11, a0, -20
    rfwo
    .org 0x140                  /* WindowUnderflow12 */
    l32e a1, a13, -12
    l32e a0, a13, -16
    l32e a11, a1, -12
    l32e a2, a13, -8
    l32e a4, a11, -48
    l32e a8, a11, -32
    l32e a3, a13, -4
    l32e a5, a11, -44
    l32e a6, a11, -40
    l32e a7, a11, -36
    l32e a9, a11, -28
    l32e a10, a11, -24
    l32e a11, a11, -20
    rfwu
    .org 0x300                  /* KernelExceptionVector */
    j flm_xt_fault
    .org 0x340                  /* UserExceptionVector */
    wsr a0, excsave1
    rsr a0, exccause
    bnei a0, 5, 1f              /* 5: AllocaCause, a MOVSP */
    j flm_xt_alloca
1:  j flm_xt_fault
    .org 0x3c0                  /* DoubleExceptionVector: a fault inside a vector */
    j flm_xt_fault
    .org 0x400

    .text
    .p2align 2
    .literal_position
    .literal .Lvectors, flm_xt_vectors
    .literal .Lstack, __stack_top
    .literal .Lfault_stack, __fault_stack_top
    .literal .Lbss_start, __bss_start
    .literal .Lbss_end, __bss_end
    .literal .Lmain, main
    .literal .Lexit, flm_xt_exit
    .literal .Lreport, flm_xt_fault_report

    .p2align 2
    .global flm_xt_start
flm_xt_start:
    l32r a2, .Lvectors
    wsr a2, vecbase
    movi a2, 1
    wsr a2, cpenable
    movi a2, 0
    wsr a2, windowbase
    rsync
    movi a2, 1
    wsr a2, windowstart
    rsync
    l32r a1, .Lstack
    movi a2, 0x40020            /* PS: WOE (bit 18) | UM (bit 5), EXCM 0, INTLEVEL 0 */
    wsr a2, ps
    rsync
    l32r a2, .Lbss_start
    l32r a3, .Lbss_end
    movi a4, 0
3:  bgeu a2, a3, 4f
    s32i a4, a2, 0
    addi a2, a2, 4
    j 3b
4:  movi a0, 0
    l32r a4, .Lmain
    callx4 a4                   /* main's result comes back in our a6, the exit's argument */
    l32r a4, .Lexit
    callx4 a4
5:  j 5b

/* AllocaCause. Clang moves the stack pointer with MOVSP around a call that passes arguments on the
 * stack (beyond a2-a7); MOVSP raises this exception when the caller's frame is not in the register
 * file (spilled by a window overflow), because that frame's base save area sits below the stack
 * pointer MOVSP moves. The cure: bring the caller's frame back (the underflow code for its call
 * size), then retry the MOVSP, which then moves the stack pointer of a live frame; a later overflow
 * saves that frame below the new stack pointer. The underflow code ends in RFWU, which returns to
 * the window in PS.OWB and to EPC1 (the MOVSP): a general exception does not set PS.OWB, so this
 * sets it to the current window first. Scratch: EXCSAVE1 (a0, saved by the vector), MISC0-1. */
    .p2align 2
flm_xt_alloca:
    wsr a2, misc0
    wsr a3, misc1
    rsr a2, ps
    rsr a3, windowbase
    slli a3, a3, 8              /* PS.OWB is PS bits 8-11 */
    xor a3, a3, a2
    extui a3, a3, 8, 4
    slli a3, a3, 8              /* the bits where PS.OWB differs from WINDOWBASE */
    xor a2, a2, a3
    wsr a2, ps
    rsync
    rsr a0, excsave1
    extui a2, a0, 30, 2         /* the caller's call size: 1 call4, 2 call8, 3 call12 */
    rsr a3, misc1
    bgei a2, 3, 12f
    bgei a2, 2, 8f
    rsr a2, misc0
    rotw -1                     /* the caller's frame is current; our a1 is its a5 */
    j flm_xt_vectors + 0x40     /* WindowUnderflow4 */
8:  rsr a2, misc0
    rotw -2
    j flm_xt_vectors + 0xc0     /* WindowUnderflow8 */
12: rsr a2, misc0
    rotw -3
    j flm_xt_vectors + 0x140    /* WindowUnderflow12 */

    .p2align 2
flm_xt_fault:
    rsr a6, exccause            /* the report's arguments, in the callee's a2-a4 after call4 */
    rsr a7, epc1
    rsr a8, excvaddr
    rsr a2, windowbase          /* keep the current frame alone live: nothing is returned to */
    movi a3, 1
    ssl a2
    sll a3, a3
    wsr a3, windowstart
    rsync
    l32r a1, .Lfault_stack
    movi a2, 0x4000f            /* PS: WOE, INTLEVEL 15, EXCM 0, UM 0 (a fault in the report: kernel vector, same path) */
    wsr a2, ps
    rsync
    l32r a4, .Lreport
    callx4 a4
6:  j 6b
