/* The plain-text console: a line typed at a serial monitor is a prompt, answered in plain text. */
#ifndef FLM_APP_CONSOLE_H
#define FLM_APP_CONSOLE_H

/* Answer the console line app_receive returned. */
void app_console_line(void);
/* A frame after console lines: say so once, in the protocol. */
void app_report_console(void);
#endif
