/* token.c - see token.h. */
#include "util/token.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "util/clock.h"

static void token_hex(const unsigned char *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static int token_random(void *buf, size_t n)
{
    size_t got = 0;

    while (got < n) {
        ssize_t r = getrandom((char *)buf + got, n - got, 0);

        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)r;
    }
    return 0;
}

int token_random_hex(size_t n_bytes, char *out)
{
    unsigned char buf[256];
    int r;

    if (n_bytes > sizeof(buf))
        return -EINVAL;
    r = token_random(buf, n_bytes);
    if (r < 0)
        return r;
    token_hex(buf, n_bytes, out);
    OPENSSL_cleanse(buf, sizeof(buf));
    return 0;
}

void token_sha256_hex(const void *data, size_t len, char out[LB_SHA256_HEX + 1])
{
    unsigned char md[SHA256_DIGEST_LENGTH];

    SHA256(data, len, md);
    token_hex(md, sizeof(md), out);
}

int token_hmac_hex(const void *key, size_t key_len, const char *msg, char out[LB_SHA256_HEX + 1])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;

    if (!HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)msg, strlen(msg), md,
              &md_len) ||
        md_len != SHA256_DIGEST_LENGTH)
        return -EIO;
    token_hex(md, md_len, out);
    return 0;
}

bool token_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);

    if (la != lb)
        return false;
    return CRYPTO_memcmp(a, b, la) == 0;
}

int token_new_sandbox_id(char out[31])
{
    static const char alphabet[] = "0123456789abcdefghjkmnpqrstvwxyz";
    unsigned char bits[16]; /* 48-bit time + 80 random bits = 128 bits; 26 chars use 130 */
    uint64_t ms = (uint64_t)clock_now_s() * 1000 + (uint64_t)(clock_mono_ms() % 1000);
    int r;

    for (int i = 0; i < 6; i++)
        bits[i] = (unsigned char)(ms >> (40 - 8 * i));
    r = token_random(bits + 6, 10);
    if (r < 0)
        return r;
    memcpy(out, "sbx-", 4);
    /* Read the 128 bits 5 at a time from the top (the first char takes 3 bits). */
    for (int c = 0; c < 26; c++) {
        int bit = c * 5 - 2; /* index of the first bit of this char; -2 pads the top */
        unsigned v = 0;

        for (int k = 0; k < 5; k++, bit++) {
            v <<= 1;
            if (bit >= 0)
                v |= (bits[bit / 8] >> (7 - bit % 8)) & 1u;
        }
        out[4 + c] = alphabet[v];
    }
    out[30] = '\0';
    return 0;
}

int token_base64_encode(const void *data, size_t len, char **out, size_t *out_len)
{
    size_t n = 4 * ((len + 2) / 3);
    char *p;

    if (len > (size_t)INT32_MAX)
        return -EFBIG;
    p = malloc(n + 1);
    if (!p)
        return -ENOMEM;
    EVP_EncodeBlock((unsigned char *)p, data, (int)len);
    p[n] = '\0';
    *out = p;
    if (out_len)
        *out_len = n;
    return 0;
}

int token_base64_decode(const char *text, size_t text_len, unsigned char **out, size_t *out_len)
{
    unsigned char *p;
    size_t pad = 0;
    int n;

    if (text_len % 4 != 0 || text_len > (size_t)INT32_MAX)
        return -EINVAL;
    for (size_t i = 0; i < text_len; i++) {
        char c = text[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '+' || c == '/' || (c == '=' && i >= text_len - 2);

        if (!ok || (pad && c != '='))
            return -EINVAL;
        if (c == '=')
            pad++;
    }
    p = malloc(text_len / 4 * 3 + 1);
    if (!p)
        return -ENOMEM;
    n = text_len ? EVP_DecodeBlock(p, (const unsigned char *)text, (int)text_len) : 0;
    if (n < 0) {
        free(p);
        return -EINVAL;
    }
    *out = p;
    *out_len = (size_t)n - pad; /* EVP_DecodeBlock counts padding as zero bytes */
    return 0;
}
