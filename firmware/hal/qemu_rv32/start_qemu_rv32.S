/* Start-up of the RISC-V QEMU boards (esp32c3-isa-qemu, esp32p4-isa-qemu) on QEMU's virt machine (-bios none: QEMU starts the
 * hart at the ELF's entry in machine mode). Sets the global and stack pointers, copies .data from
 * its load image, clears .bss, installs the trap handler and calls main. A trap (an illegal
 * instruction, a misaligned or faulting access, ebreak) is reported by hal_qemu_rv32.c's
 * flm_rv32_trap, which ends QEMU with the cause as its exit status. */
    .section .text.start, "ax"
    .globl _start
_start:
    .option push
    .option norelax
    la gp, __global_pointer$
    .option pop
    la sp, __stack_top
    la t0, flm_rv32_trap_entry
    csrw mtvec, t0
#ifdef __riscv_flen
    li t0, 0x2000               /* a build with F (the ESP32-P4's rv32imafc): mstatus.FS = Initial, */
    csrs mstatus, t0            /* else every float instruction traps */
#endif
    la t0, __data_lma
    la t1, __data_start
    la t2, __data_end
1:  bgeu t1, t2, 2f
    lw t3, 0(t0)
    sw t3, 0(t1)
    addi t0, t0, 4
    addi t1, t1, 4
    j 1b
2:  la t1, __bss_start
    la t2, __bss_end
3:  bgeu t1, t2, 4f
    sw zero, 0(t1)
    addi t1, t1, 4
    j 3b
4:  call main
    li a0, 0
    call flm_rv32_exit
5:  j 5b

/* direct mode (mtvec low bits 0): every trap lands here; interrupts are never enabled in mstatus
 * (hal_idle's wfi only waits for one), so any trap is an exception */
    .p2align 2
flm_rv32_trap_entry:
    csrr a0, mcause
    csrr a1, mepc
    csrr a2, mtval
    call flm_rv32_trap
6:  j 6b
