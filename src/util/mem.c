/* mem.c - see mem.h. */
#include "util/mem.h"

#include <stdlib.h>

void mem_free_strings(char **const slots[], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(*slots[i]);
        *slots[i] = NULL;
    }
}
