/* zlib-compatible CRC-32, shared by the blob check and the serial protocol. */
#ifndef FLM_CRC32_H
#define FLM_CRC32_H
#include <stddef.h>
#include <stdint.h>
/* crc = flm_crc32_update(0, data, len) equals zlib.crc32(data); chain calls for streams. */
uint32_t flm_crc32_update(uint32_t crc, const void *data, size_t len);
#endif
