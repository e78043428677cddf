/*
 * mem.h - freeing a struct's owned string fields in one call.
 *
 * Thread-safety: none of its own; the caller owns the fields it names.
 */
#ifndef LB_MEM_H
#define LB_MEM_H

#include <stddef.h>

/* Free *slots[i] (a malloc'd string, or NULL) for each of the n slots and set it to NULL.
 * slots: the addresses of the caller's char * fields; not owned. Cannot fail. */
void mem_free_strings(char **const slots[], size_t n);

#endif
