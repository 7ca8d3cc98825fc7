#include "flm_math.h"
#include <stdint.h>

/* Constants as hex floats so both sides hold the very same binary32 values. */
#define EXP_T 0x1.715476p+16f        /* log2(e) * 2^16: x in log2 units with 16 fractional bits */
#define EXP_LO (-86.0f)              /* below: 0 (keeps 2^k and the result normal) */
#define EXP_HI 88.0f                 /* above: +inf */

const uint32_t flm_exp2_q23[257] = {
    8388608u, 8411352u, 8434157u, 8457025u, 8479954u, 8502945u, 8525999u, 8549116u,
    8572295u, 8595536u, 8618841u, 8642209u, 8665641u, 8689136u, 8712694u, 8736317u,
    8760003u, 8783754u, 8807569u, 8831449u, 8855394u, 8879403u, 8903477u, 8927617u,
    8951823u, 8976093u, 9000430u, 9024833u, 9049301u, 9073837u, 9098438u, 9123107u,
    9147842u, 9172644u, 9197514u, 9222451u, 9247455u, 9272528u, 9297668u, 9322877u,
    9348154u, 9373499u, 9398913u, 9424396u, 9449948u, 9475570u, 9501261u, 9527021u,
    9552851u, 9578752u, 9604722u, 9630764u, 9656875u, 9683058u, 9709311u, 9735636u,
    9762032u, 9788499u, 9815039u, 9841650u, 9868333u, 9895089u, 9921917u, 9948818u,
    9975792u, 10002839u, 10029960u, 10057154u, 10084422u, 10111763u, 10139179u, 10166669u,
    10194234u, 10221873u, 10249587u, 10277377u, 10305242u, 10333182u, 10361198u, 10389290u,
    10417458u, 10445703u, 10474024u, 10502422u, 10530897u, 10559449u, 10588079u, 10616786u,
    10645571u, 10674434u, 10703375u, 10732395u, 10761494u, 10790671u, 10819928u, 10849263u,
    10878679u, 10908174u, 10937749u, 10967404u, 10997140u, 11026956u, 11056853u, 11086831u,
    11116891u, 11147032u, 11177254u, 11207559u, 11237946u, 11268415u, 11298967u, 11329601u,
    11360319u, 11391120u, 11422004u, 11452973u, 11484025u, 11515161u, 11546382u, 11577687u,
    11609078u, 11640553u, 11672114u, 11703760u, 11735492u, 11767310u, 11799215u, 11831206u,
    11863283u, 11895448u, 11927700u, 11960039u, 11992466u, 12024981u, 12057584u, 12090275u,
    12123055u, 12155924u, 12188882u, 12221930u, 12255067u, 12288294u, 12321610u, 12355018u,
    12388516u, 12422104u, 12455784u, 12489555u, 12523418u, 12557372u, 12591419u, 12625557u,
    12659789u, 12694113u, 12728530u, 12763041u, 12797645u, 12832343u, 12867135u, 12902021u,
    12937002u, 12972078u, 13007249u, 13042515u, 13077877u, 13113335u, 13148888u, 13184539u,
    13220286u, 13256129u, 13292070u, 13328109u, 13364245u, 13400479u, 13436812u, 13473242u,
    13509772u, 13546401u, 13583129u, 13619956u, 13656884u, 13693911u, 13731039u, 13768268u,
    13805598u, 13843028u, 13880561u, 13918195u, 13955931u, 13993769u, 14031710u, 14069754u,
    14107901u, 14146151u, 14184505u, 14222963u, 14261526u, 14300193u, 14338964u, 14377841u,
    14416824u, 14455912u, 14495106u, 14534406u, 14573813u, 14613326u, 14652947u, 14692675u,
    14732511u, 14772455u, 14812507u, 14852668u, 14892937u, 14933316u, 14973805u, 15014403u,
    15055111u, 15095929u, 15136859u, 15177899u, 15219050u, 15260313u, 15301688u, 15343175u,
    15384775u, 15426487u, 15468313u, 15510252u, 15552304u, 15594471u, 15636752u, 15679147u,
    15721658u, 15764283u, 15807025u, 15849882u, 15892855u, 15935945u, 15979152u, 16022476u,
    16065917u, 16109476u, 16153153u, 16196949u, 16240863u, 16284897u, 16329050u, 16373322u,
    16417715u, 16462228u, 16506861u, 16551616u, 16596492u, 16641490u, 16686609u, 16731851u,
    16777216u
};

/* The range tests compare the floats' bits (the same outcomes as the float comparisons, without a
 * soft-float call each on cores without an FPU): a magnitude orders as an unsigned integer. One
 * float multiply, then integers: n = round(x * EXP_T), the float 2^(n >> 16) * flm_exp2_frac(n & 0xFFFF)
 * / 2^23 packed from its exponent and significand. */
float flm_expf(float x) {
    const uint32_t b = flm_f32_bits(x), mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) return x;                  /* NaN: never converted to an integer (undefined in C) */
    if (b >> 31 && mag > flm_f32_bits(-EXP_LO)) return 0.0f;  /* x < EXP_LO */
    if (!(b >> 31) && mag > flm_f32_bits(EXP_HI)) return flm_f32_from_bits(0x7f800000u);
    const uint32_t tb = flm_f32_bits(x * EXP_T);
    const int32_t n = tb >> 31 ? -flm_round_half_away(tb & 0x7fffffffu) : flm_round_half_away(tb);
    const uint32_t f = (uint32_t)n & 0xffffu;
    const int32_t i = (n - (int32_t)f) / 65536;      /* floor(n / 2^16): |i| <= 127 */
    return flm_f32_from_bits((uint32_t)(i + 127) * 0x800000u + flm_exp2_frac(f) - 0x800000u);
}

float flm_sqrtf(float x) {
    const uint32_t b = flm_f32_bits(x);
    if (!(x > 0.0f) || b >= 0x7f800000u) return x;   /* 0, -0, negatives, inf, nan: unused */
    int32_t e = (int32_t)(b >> 23);
    uint32_t m = b & 0x7fffffu;
    if (e == 0) {                                  /* subnormal: normalise */
        e = 1;
        while (!(m & 0x800000u)) { m <<= 1; e--; }
    } else {
        m |= 0x800000u;
    }
    int32_t ex = e - 150;                          /* x = m * 2^ex, m in [2^23, 2^24) */
    if (ex & 1) { m <<= 1; ex -= 1; }              /* even exponent: m in [2^23, 2^25) */
    int s = (m < (1u << 24)) ? 26 : 24;            /* M = m << s in [2^48, 2^50) */
    uint64_t M = (uint64_t)m << s;
    /* floor(sqrt(M)), 25 bits, digit by digit */
    uint64_t root = 0, rem = M, bit = (uint64_t)1 << 48;
    while (bit) {
        if (rem >= root + bit) { rem -= root + bit; root = (root >> 1) + bit; }
        else root >>= 1;
        bit >>= 2;
    }
    /* round to 24 bits; an exact tie is impossible because M is even and not an odd square */
    uint32_t r = (uint32_t)((root + 1) >> 1);
    int32_t k = (ex - s) / 2 + 1;                  /* sqrt(x) = r * 2^k */
    if (r == (1u << 24)) { r >>= 1; k += 1; }
    return flm_f32_from_bits(((uint32_t)(k + 23 + 127) << 23) | (r & 0x7fffffu));
}

float flm_silu(float x) { return x / (1.0f + flm_expf(-x)); }

/* sqrt(2/pi) and sqrt(2/pi) * 0.044715, each rounded once to binary32 (numerics.py GELU_K0/K1) */
#define GELU_K0 0x1.988454p-1f
#define GELU_K1 0x1.2444f2p-5f

float flm_gelu(float x) {
    float u = x * (GELU_K0 + GELU_K1 * (x * x));
    return x / (1.0f + flm_expf(-(u + u)));
}

/* The defaults in blocks of 8 elements, loops of a constant length that compilers vectorise at -O2
 * (element-wise products and sums round per element as the scalar code does: the sum keeps its
 * order, one add after another). */
#define BLOCK 8u

__attribute__((weak)) float flm_dot_f32(const float *a, const float *b, uint32_t n) {
    float s = a[0] * b[0];
    uint32_t i = 1;
    for (a++, b++; i + BLOCK <= n; i += BLOCK, a += BLOCK, b += BLOCK) {
        float p[BLOCK];
        for (uint32_t k = 0; k < BLOCK; k++) p[k] = a[k] * b[k];
        for (uint32_t k = 0; k < BLOCK; k++) s = s + p[k];
    }
    for (; i < n; i++) s = s + *a++ * *b++;
    return s;
}

__attribute__((weak)) void flm_axpy_f32(float *restrict o, float a, const float *restrict v, uint32_t n) {
    uint32_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK, o += BLOCK, v += BLOCK)
        for (uint32_t k = 0; k < BLOCK; k++) o[k] = o[k] + a * v[k];
    for (; i < n; i++, o++) *o = *o + a * *v++;
}
