/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_JSON_H
#define KVMDIRTY_MIGRATE_JSON_H

/*
 * A JSON reader for what the stats lines use (RFC 8259: objects, arrays,
 * numbers, strings, true, false, null), for input nobody vouches for: it
 * reads exactly len bytes (NULs included, no terminator needed), nests at
 * most MIG_JSON_MAX_DEPTH deep, takes only finite numbers, and says where
 * it stopped.  No I/O.
 */
#include <stdbool.h>
#include <stddef.h>

#define MIG_JSON_MAX_DEPTH 32

enum mig_json_type {
	MIG_JSON_NULL,
	MIG_JSON_FALSE,
	MIG_JSON_TRUE,
	MIG_JSON_NUMBER,
	MIG_JSON_STRING,
	MIG_JSON_ARRAY,
	MIG_JSON_OBJECT,
};

struct mig_json_member;

struct mig_json {
	enum mig_json_type type;
	/* where its text stands in the input, s[offset..end): a reply can echo a value as it came */
	size_t offset, end;
	union {
		double num;
		/* UTF-8 as the input had it, escapes decoded; may hold NULs; s[len] is 0 */
		struct {
			char *s;
			size_t len;
		} str;
		struct {
			struct mig_json *v;
			size_t n;
		} arr;
		struct {
			struct mig_json_member *m;
			size_t n;
		} obj;
	};
};

struct mig_json_member {
	struct mig_json key; /* a string */
	struct mig_json v;
};

struct mig_json_error {
	size_t offset;	/* where the reader stopped */
	bool truncated; /* the input ended inside the value: what there is could begin a valid one */
	char msg[80];	/* what it expected there, one line */
};

/*
 * One JSON value in s[0..len), with only whitespace around it.  Returns 0
 * and fills *ret (free it with mig_json_free()), -EINVAL with *e filled,
 * or -ENOMEM.
 */
int mig_json_parse(const char *s, size_t len, struct mig_json *ret, struct mig_json_error *e);
void mig_json_free(struct mig_json *v);

/* An object's member by key (the first, if the key repeats), or NULL; NULL for anything but an object. */
const struct mig_json *mig_json_get(const struct mig_json *obj, const char *key);

#endif
