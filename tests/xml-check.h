/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TESTS_XML_CHECK_H
#define KVMDIRTY_TESTS_XML_CHECK_H

/*
 * Is a document well-formed XML 1.0?  For the tests and the fuzzer of the
 * plot's SVG, where a real parser (Python's, xmllint) is not at hand: an
 * optional declaration and comments, one root element, elements that
 * nest and close by name, attributes quoted once each, character data
 * and attribute values without '<' and with '&' only in an entity or a
 * character reference, and only characters XML allows, in valid UTF-8.
 * No DTD, CDATA or processing instruction after the declaration: the
 * plot writes none.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define XML_CHECK_DEPTH 64

struct xml_check {
	const unsigned char *s;
	size_t n, i;
	char why[128];
};

static inline int xml_fail(struct xml_check *x, const char *what)
{
	snprintf(x->why, sizeof(x->why), "byte %zu: %s", x->i, what);
	return -1;
}

/* One character at i that XML allows; its length, or 0. */
static inline size_t xml_check_char(const struct xml_check *x)
{
	const unsigned char *c = x->s + x->i;
	size_t left = x->n - x->i, len, k;
	unsigned int u;

	if (c[0] < 0x80)
		return c[0] >= 0x20 || c[0] == '\t' || c[0] == '\n' || c[0] == '\r';
	len = c[0] >= 0xf0 && c[0] <= 0xf4 ? 4 : c[0] >= 0xe0 && c[0] <= 0xef ? 3 : c[0] >= 0xc2 && c[0] <= 0xdf ? 2 : 0;
	if (!len || left < len)
		return 0;
	u = c[0] & (0x7f >> len);
	for (k = 1; k < len; k++) {
		if ((c[k] & 0xc0) != 0x80)
			return 0;
		u = u << 6 | (c[k] & 0x3f);
	}
	if ((len == 3 && u < 0x800) || (len == 4 && (u < 0x10000 || u > 0x10ffff)) || (u >= 0xd800 && u <= 0xdfff) ||
	    u == 0xfffe || u == 0xffff)
		return 0;
	return len;
}

static inline bool xml_check_name_char(unsigned char c, bool first)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
	       (!first && ((c >= '0' && c <= '9') || c == '-' || c == '.'));
}

/* A name at i; its length (0: none). */
static inline size_t xml_check_name(struct xml_check *x)
{
	size_t start = x->i;

	while (x->i < x->n && xml_check_name_char(x->s[x->i], x->i == start))
		x->i++;
	return x->i - start;
}

static inline void xml_check_ws(struct xml_check *x)
{
	while (x->i < x->n && (x->s[x->i] == ' ' || x->s[x->i] == '\t' || x->s[x->i] == '\n' || x->s[x->i] == '\r'))
		x->i++;
}

/* Text up to stop ('<' for character data, '"' for a value): characters XML allows, '&' only as a reference. */
static inline int xml_check_text(struct xml_check *x, unsigned char stop)
{
	static const char *const ent[] = { "amp;", "lt;", "gt;", "quot;", "apos;" };
	size_t len, e;

	while (x->i < x->n && x->s[x->i] != stop) {
		if (x->s[x->i] == '<')
			return xml_fail(x, "'<' in an attribute value");
		if (x->s[x->i] == '&') {
			x->i++;
			for (e = 0; e < 5; e++)
				if (x->n - x->i >= strlen(ent[e]) && !memcmp(x->s + x->i, ent[e], strlen(ent[e])))
					break;
			if (e < 5) {
				x->i += strlen(ent[e]);
				continue;
			}
			if (x->i >= x->n || x->s[x->i] != '#')
				return xml_fail(x, "'&' that starts no reference");
			for (x->i++, len = 0; x->i < x->n && x->s[x->i] != ';' && len < 8; x->i++, len++)
				;
			if (x->i >= x->n || x->s[x->i] != ';' || !len)
				return xml_fail(x, "a character reference without its ';'");
			x->i++;
			continue;
		}
		len = xml_check_char(x);
		if (!len)
			return xml_fail(x, "a character XML does not allow, or bad UTF-8");
		x->i += len;
	}
	return 0;
}

/* Skip a comment or the declaration at i, if one is there; -1 if one is not closed. */
static inline int xml_check_misc(struct xml_check *x, bool *skipped)
{
	const char *end = NULL;
	size_t k;

	*skipped = false;
	if (x->n - x->i >= 4 && !memcmp(x->s + x->i, "<!--", 4))
		end = "-->";
	else if (x->i == 0 && x->n >= 5 && !memcmp(x->s, "<?xml", 5))
		end = "?>";
	if (!end)
		return 0;
	for (k = x->i + 2; k + strlen(end) <= x->n; k++)
		if (!memcmp(x->s + k, end, strlen(end))) {
			x->i = k + strlen(end);
			*skipped = true;
			return 0;
		}
	return xml_fail(x, "a comment or declaration that does not end");
}

/* 0 if s[0..n) is well-formed; else -1 with the reason in x->why. */
static inline int xml_check(struct xml_check *x, const char *s, size_t n)
{
	size_t stack[XML_CHECK_DEPTH], slen[XML_CHECK_DEPTH], depth = 0, roots = 0, name, nlen, attrs[32], na, k;
	bool skipped;

	memset(x, 0, sizeof(*x));
	x->s = (const unsigned char *)s;
	x->n = n;
	for (;;) {
		if (depth)
			if (xml_check_text(x, '<') < 0)
				return -1;
		if (!depth)
			xml_check_ws(x);
		if (x->i >= x->n)
			break;
		if (x->s[x->i] != '<')
			return xml_fail(x, "text outside the root element");
		if (xml_check_misc(x, &skipped) < 0)
			return -1;
		if (skipped)
			continue;
		x->i++;
		if (x->i < x->n && x->s[x->i] == '/') {
			x->i++;
			name = x->i;
			nlen = xml_check_name(x);
			if (!depth || nlen != slen[depth - 1] || memcmp(x->s + name, x->s + stack[depth - 1], nlen))
				return xml_fail(x, "an end tag that closes no open element of its name");
			xml_check_ws(x);
			if (x->i >= x->n || x->s[x->i] != '>')
				return xml_fail(x, "'>' to end an end tag");
			x->i++;
			depth--;
			continue;
		}
		if (!depth && roots++)
			return xml_fail(x, "a second root element");
		name = x->i;
		nlen = xml_check_name(x);
		if (!nlen)
			return xml_fail(x, "an element name after '<'");
		for (na = 0;;) {
			size_t before = x->i, an;

			xml_check_ws(x);
			if (x->i < x->n && (x->s[x->i] == '>' || x->s[x->i] == '/'))
				break;
			if (x->i == before)
				return xml_fail(x, "white space, '>' or '/>' after a name or value");
			an = x->i;
			if (!xml_check_name(x))
				return xml_fail(x, "an attribute name");
			for (k = 0; k < na; k++)
				if (attrs[2 * k + 1] == x->i - an && !memcmp(x->s + attrs[2 * k], x->s + an, x->i - an))
					return xml_fail(x, "an attribute given twice");
			if (na < 16) {
				attrs[2 * na] = an;
				attrs[2 * na + 1] = x->i - an;
				na++;
			}
			if (x->i + 1 >= x->n || x->s[x->i] != '=' || x->s[x->i + 1] != '"')
				return xml_fail(x, "=\" after an attribute name");
			x->i += 2;
			if (xml_check_text(x, '"') < 0)
				return -1;
			if (x->i >= x->n)
				return xml_fail(x, "'\"' to end an attribute value");
			x->i++;
		}
		if (x->s[x->i] == '/') {
			if (x->i + 1 >= x->n || x->s[x->i + 1] != '>')
				return xml_fail(x, "'>' after '/'");
			x->i += 2;
			continue;
		}
		x->i++;
		if (depth == XML_CHECK_DEPTH)
			return xml_fail(x, "elements nested deeper than this check follows");
		stack[depth] = name;
		slen[depth++] = nlen;
	}
	if (depth)
		return xml_fail(x, "the end inside an element");
	if (!roots)
		return xml_fail(x, "no root element");
	return 0;
}

#endif
