/*
 * The libpq oracle of tests/dsn_libpq.rs: reads DSNs from standard input,
 * each ended by a NUL byte, and prints for each one line with what
 * PQconninfoParse makes of it:
 *
 *   OK keyword=HEX keyword=HEX ...   (the options it set, values in hex)
 *   ERR                              (it refused the DSN)
 *
 * With the argument --keywords it prints the keywords libpq knows instead,
 * one a line. Hex keeps every byte of a value (spaces, newlines, non-UTF-8)
 * unambiguous.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libpq-fe.h>

static void print_hex(const char *s)
{
	for (const unsigned char *p = (const unsigned char *) s; *p; p++)
		printf("%02x", *p);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--keywords") == 0)
	{
		PQconninfoOption *opts = PQconndefaults();
		if (opts == NULL)
			return 1;
		for (PQconninfoOption *o = opts; o->keyword; o++)
			printf("%s\n", o->keyword);
		PQconninfoFree(opts);
		return 0;
	}
	size_t cap = 1024, len = 0;
	char *buf = malloc(cap);
	int c;
	if (buf == NULL)
		return 1;
	while ((c = getchar()) != EOF)
	{
		if (len + 1 >= cap)
		{
			cap *= 2;
			buf = realloc(buf, cap);
			if (buf == NULL)
				return 1;
		}
		if (c != 0)
		{
			buf[len++] = (char) c;
			continue;
		}
		buf[len] = '\0';
		len = 0;
		char *err = NULL;
		PQconninfoOption *opts = PQconninfoParse(buf, &err);
		if (opts == NULL)
		{
			printf("ERR\n");
			fflush(stdout);
			PQfreemem(err);
			continue;
		}
		printf("OK");
		for (PQconninfoOption *o = opts; o->keyword; o++)
		{
			if (o->val == NULL)
				continue;
			printf(" %s=", o->keyword);
			print_hex(o->val);
		}
		printf("\n");
		fflush(stdout);
		PQconninfoFree(opts);
	}
	free(buf);
	return 0;
}
