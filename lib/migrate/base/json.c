// SPDX-License-Identifier: MIT
/*
 * The JSON reader (json.h): recursive descent, bounded by
 * MIG_JSON_MAX_DEPTH.  Every read checks the end of the input first, so
 * that a value cut short is told from a wrong one (e->truncated): a stats
 * file whose writer was killed ends inside its last line.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

struct parser {
	const char *s;
	size_t len, pos;
	struct mig_json_error *e;
};

/* Stop at pos: cut short if the input ended there, wrong otherwise. */
static int __attribute__((format(printf, 2, 3))) fail(struct parser *p, const char *fmt, ...)
{
	va_list ap;

	p->e->offset = p->pos;
	p->e->truncated = p->pos >= p->len;
	va_start(ap, fmt);
	vsnprintf(p->e->msg, sizeof(p->e->msg), fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static bool at_end(const struct parser *p)
{
	return p->pos >= p->len;
}

static void skip_ws(struct parser *p)
{
	while (!at_end(p) && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' ||
			      p->s[p->pos] == '\r'))
		p->pos++;
}

static bool is_digit(const struct parser *p)
{
	return !at_end(p) && p->s[p->pos] >= '0' && p->s[p->pos] <= '9';
}

static int parse_value(struct parser *p, struct mig_json *v, unsigned int depth);

static int parse_literal(struct parser *p, struct mig_json *v, const char *word, enum mig_json_type type)
{
	size_t i;

	for (i = 0; word[i]; i++, p->pos++)
		if (at_end(p) || p->s[p->pos] != word[i])
			return fail(p, "'%s'", word);
	v->type = type;
	return 0;
}

/* RFC 8259's grammar first (strtod takes more: hex, inf, nan), then strtod on exactly that. */
static int parse_number(struct parser *p, struct mig_json *v)
{
	size_t start = p->pos, n;
	char small[64], *buf = small, *end;
	bool whole;
	double d;

	if (p->s[p->pos] == '-')
		p->pos++;
	if (!is_digit(p))
		return fail(p, "a digit");
	if (p->s[p->pos++] != '0')
		while (is_digit(p))
			p->pos++;
	if (!at_end(p) && p->s[p->pos] == '.') {
		p->pos++;
		if (!is_digit(p))
			return fail(p, "a digit after '.'");
		while (is_digit(p))
			p->pos++;
	}
	if (!at_end(p) && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
		p->pos++;
		if (!at_end(p) && (p->s[p->pos] == '+' || p->s[p->pos] == '-'))
			p->pos++;
		if (!is_digit(p))
			return fail(p, "a digit in the exponent");
		while (is_digit(p))
			p->pos++;
	}
	n = p->pos - start;
	if (n >= sizeof(small) && !(buf = malloc(n + 1)))
		return -ENOMEM;
	memcpy(buf, p->s + start, n);
	buf[n] = 0;
	d = strtod(buf, &end);
	whole = (size_t)(end - buf) == n;
	if (buf != small)
		free(buf);
	if (!whole || !isfinite(d)) {
		p->pos = start;
		return fail(p, "a number a double holds");
	}
	v->type = MIG_JSON_NUMBER;
	v->num = d;
	return 0;
}

static int hex4(struct parser *p, unsigned int *ret)
{
	unsigned int i, u = 0;

	for (i = 0; i < 4; i++, p->pos++) {
		char c;

		if (at_end(p))
			return fail(p, "four hex digits after '\\u'");
		c = p->s[p->pos];
		if (c >= '0' && c <= '9')
			u = u * 16 + (unsigned int)(c - '0');
		else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
			u = u * 16 + (unsigned int)((c | 0x20) - 'a' + 10);
		else
			return fail(p, "four hex digits after '\\u'");
	}
	*ret = u;
	return 0;
}

/* \uXXXX, or a surrogate pair of them, as UTF-8 at out; the bytes written. */
static int unicode_escape(struct parser *p, char *out)
{
	unsigned int u, lo;
	int ret = hex4(p, &u);

	if (ret < 0)
		return ret;
	if (u >= 0xdc00 && u <= 0xdfff) {
		p->pos -= 4;
		return fail(p, "no lone low surrogate");
	}
	if (u >= 0xd800 && u <= 0xdbff) {
		if (at_end(p) || p->s[p->pos] != '\\')
			return fail(p, "'\\u' and a low surrogate after a high one");
		p->pos++;
		if (at_end(p) || p->s[p->pos] != 'u')
			return fail(p, "'\\u' and a low surrogate after a high one");
		p->pos++;
		ret = hex4(p, &lo);
		if (ret < 0)
			return ret;
		if (lo < 0xdc00 || lo > 0xdfff) {
			p->pos -= 4;
			return fail(p, "a low surrogate after a high one");
		}
		u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
	}
	if (u < 0x80) {
		out[0] = (char)u;
		return 1;
	}
	if (u < 0x800) {
		out[0] = (char)(0xc0 | u >> 6);
		out[1] = (char)(0x80 | (u & 0x3f));
		return 2;
	}
	if (u < 0x10000) {
		out[0] = (char)(0xe0 | u >> 12);
		out[1] = (char)(0x80 | ((u >> 6) & 0x3f));
		out[2] = (char)(0x80 | (u & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | u >> 18);
	out[1] = (char)(0x80 | ((u >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((u >> 6) & 0x3f));
	out[3] = (char)(0x80 | (u & 0x3f));
	return 4;
}

static int parse_string(struct parser *p, struct mig_json *v)
{
	static const char plain[] = "\"\\/bfnrt", decoded[] = "\"\\/\b\f\n\r\t";
	size_t i, n = 0, raw, start = p->pos;
	char *out;
	int ret;

	/* decoded, a string never grows: its length in the input bounds it */
	for (raw = p->pos + 1; raw < p->len && p->s[raw] != '"'; raw += p->s[raw] == '\\' ? 2 : 1)
		;
	out = malloc(raw - p->pos);
	if (!out)
		return -ENOMEM;
	for (p->pos++;; p->pos++) {
		unsigned char c;

		if (at_end(p)) {
			ret = fail(p, "'\"' to end the string");
			goto err;
		}
		c = (unsigned char)p->s[p->pos];
		if (c == '"')
			break;
		if (c < 0x20) {
			ret = fail(p, "an escape, not a control character, in a string");
			goto err;
		}
		if (c != '\\') {
			out[n++] = (char)c;
			continue;
		}
		p->pos++;
		if (at_end(p)) {
			ret = fail(p, "an escape after '\\'");
			goto err;
		}
		for (i = 0; plain[i] && plain[i] != p->s[p->pos]; i++)
			;
		if (plain[i]) {
			out[n++] = decoded[i];
		} else if (p->s[p->pos] == 'u') {
			p->pos++;
			ret = unicode_escape(p, out + n);
			if (ret < 0)
				goto err;
			n += (size_t)ret;
			p->pos--;
		} else {
			ret = fail(p, "an escape after '\\' (one of \"\\/bfnrtu)");
			goto err;
		}
	}
	p->pos++;
	out[n] = 0;
	v->type = MIG_JSON_STRING;
	v->offset = start;
	v->end = p->pos;
	v->str.s = out;
	v->str.len = n;
	return 0;
err:
	free(out);
	return ret;
}

/* arr with room for element n (of size bytes), *cap elements in all; NULL when out of memory. */
static void *grow(void *arr, size_t *cap, size_t n, size_t size)
{
	size_t c = *cap ? *cap * 2 : 4;
	void *a;

	if (n < *cap)
		return arr;
	a = realloc(arr, c * size);
	if (a)
		*cap = c;
	return a;
}

/* After white space, c: taken (true), or left. */
static bool take(struct parser *p, char c)
{
	skip_ws(p);
	if (at_end(p) || p->s[p->pos] != c)
		return false;
	p->pos++;
	return true;
}

/* After an element: the close (1), or ',' and another (0). */
static int separator(struct parser *p, char close)
{
	if (take(p, close))
		return 1;
	if (take(p, ','))
		return 0;
	return fail(p, "',' or '%c'", close);
}

static int parse_array(struct parser *p, struct mig_json *v, unsigned int depth)
{
	size_t cap = 0;
	int ret;

	v->type = MIG_JSON_ARRAY;
	v->arr.v = NULL;
	v->arr.n = 0;
	p->pos++;
	if (take(p, ']'))
		return 0;
	do {
		struct mig_json *a = grow(v->arr.v, &cap, v->arr.n, sizeof(*a));

		if (!a) {
			ret = -ENOMEM;
			goto err;
		}
		v->arr.v = a;
		ret = parse_value(p, &a[v->arr.n], depth);
		if (ret < 0)
			goto err;
		v->arr.n++;
	} while ((ret = separator(p, ']')) == 0);
	if (ret > 0)
		return 0;
err:
	mig_json_free(v);
	return ret;
}

static int parse_object(struct parser *p, struct mig_json *v, unsigned int depth)
{
	struct mig_json_member *m;
	size_t cap = 0;
	int ret;

	v->type = MIG_JSON_OBJECT;
	v->obj.m = NULL;
	v->obj.n = 0;
	p->pos++;
	if (take(p, '}'))
		return 0;
	do {
		skip_ws(p);
		if (at_end(p) || p->s[p->pos] != '"') {
			ret = fail(p, "a member's name in '\"'");
			goto err;
		}
		m = grow(v->obj.m, &cap, v->obj.n, sizeof(*m));
		if (!m) {
			ret = -ENOMEM;
			goto err;
		}
		v->obj.m = m;
		m += v->obj.n;
		ret = parse_string(p, &m->key);
		if (ret < 0)
			goto err;
		if (!take(p, ':')) {
			free(m->key.str.s);
			ret = fail(p, "':' after a member's name");
			goto err;
		}
		ret = parse_value(p, &m->v, depth);
		if (ret < 0) {
			free(m->key.str.s);
			goto err;
		}
		v->obj.n++;
	} while ((ret = separator(p, '}')) == 0);
	if (ret > 0)
		return 0;
err:
	mig_json_free(v);
	return ret;
}

/* The value at pos, whatever its kind (white space skipped already). */
static int parse_kind(struct parser *p, struct mig_json *v, unsigned int depth)
{
	char c;

	if (at_end(p))
		return fail(p, "a value");
	c = p->s[p->pos];
	if ((c == '[' || c == '{') && depth >= MIG_JSON_MAX_DEPTH)
		return fail(p, "at most %d levels of nesting", MIG_JSON_MAX_DEPTH);
	switch (c) {
	case '{':
		return parse_object(p, v, depth + 1);
	case '[':
		return parse_array(p, v, depth + 1);
	case '"':
		return parse_string(p, v);
	case 't':
		return parse_literal(p, v, "true", MIG_JSON_TRUE);
	case 'f':
		return parse_literal(p, v, "false", MIG_JSON_FALSE);
	case 'n':
		return parse_literal(p, v, "null", MIG_JSON_NULL);
	default:
		if (c == '-' || (c >= '0' && c <= '9'))
			return parse_number(p, v);
		return fail(p, "a value");
	}
}

static int parse_value(struct parser *p, struct mig_json *v, unsigned int depth)
{
	size_t start;
	int ret;

	skip_ws(p);
	start = p->pos;
	ret = parse_kind(p, v, depth);
	if (ret < 0)
		return ret;
	v->offset = start;
	v->end = p->pos;
	return 0;
}

int mig_json_parse(const char *s, size_t len, struct mig_json *ret, struct mig_json_error *e)
{
	struct parser p = { .s = s, .len = len, .e = e };
	struct mig_json v;
	int r;

	memset(e, 0, sizeof(*e));
	r = parse_value(&p, &v, 0);
	if (r < 0)
		return r;
	skip_ws(&p);
	if (!at_end(&p)) {
		mig_json_free(&v);
		return fail(&p, "the end after the value");
	}
	*ret = v;
	return 0;
}

void mig_json_free(struct mig_json *v)
{
	size_t i;

	if (!v)
		return;
	switch (v->type) {
	case MIG_JSON_STRING:
		free(v->str.s);
		break;
	case MIG_JSON_ARRAY:
		for (i = 0; i < v->arr.n; i++)
			mig_json_free(&v->arr.v[i]);
		free(v->arr.v);
		break;
	case MIG_JSON_OBJECT:
		for (i = 0; i < v->obj.n; i++) {
			free(v->obj.m[i].key.str.s);
			mig_json_free(&v->obj.m[i].v);
		}
		free(v->obj.m);
		break;
	default:
		break;
	}
	v->type = MIG_JSON_NULL;
}

const struct mig_json *mig_json_get(const struct mig_json *obj, const char *key)
{
	size_t i, n = strlen(key);

	if (!obj || obj->type != MIG_JSON_OBJECT)
		return NULL;
	for (i = 0; i < obj->obj.n; i++)
		if (obj->obj.m[i].key.str.len == n && !memcmp(obj->obj.m[i].key.str.s, key, n))
			return &obj->obj.m[i].v;
	return NULL;
}
