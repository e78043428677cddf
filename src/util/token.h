/*
 * token.h - secrets, hashes, ids and base64, on top of OpenSSL's libcrypto and getrandom(2).
 *
 * Thread-safe: no shared state.
 */
#ifndef LB_TOKEN_H
#define LB_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

#include "util/buf.h"

#define LB_SHA256_HEX 64

/* n_bytes random bytes from the kernel, hex-encoded into out (2*n_bytes+1 bytes). 0/-errno. */
int token_random_hex(size_t n_bytes, char *out);

/* Hex SHA-256 of len bytes (out: LB_SHA256_HEX + 1 bytes). */
void token_sha256_hex(const void *data, size_t len, char out[LB_SHA256_HEX + 1]);

/* Hex HMAC-SHA-256 of msg under key (out: LB_SHA256_HEX + 1). 0 or -EIO. */
int token_hmac_hex(const void *key, size_t key_len, const char *msg, char out[LB_SHA256_HEX + 1]);

/* Constant-time equality of two NUL-terminated strings of equal length (unequal lengths are
 * unequal, and that is the only thing the timing may tell). */
bool token_equal(const char *a, const char *b);

/* A new sandbox id: "sbx-" + 26 lowercase Crockford base32 characters (48-bit millisecond
 * time + 80 random bits, like a ULID), into out (>= 31 bytes). 0 or -errno. */
int token_new_sandbox_id(char out[31]);

/* Standard base64 (with padding) of len bytes into *out (caller frees *out with free()). */
int token_base64_encode(const void *data, size_t len, char **out, size_t *out_len);
/* Decode standard base64 (padding required, no whitespace). -EINVAL if malformed. The result
 * is malloc'd (caller frees). */
int token_base64_decode(const char *text, size_t text_len, unsigned char **out, size_t *out_len);

#endif
