package io.automq.tests;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.nio.charset.StandardCharsets;
import java.security.Permission;
import org.apache.kafka.common.utils.internals.Exit;

/**
 * Runs Kafka's command-line tools one after another in this JVM, as Kafka's own tool tests do:
 * each tool's main() with its own stdin, stdout and stderr, and Exit.exit() turned into the
 * tool's exit code instead of the JVM's. Saves a JVM start (about a second) per tool run.
 *
 * <p>The first Exit.exit() (or System.exit(), as argparse4j calls on bad arguments) of a run ends it as it would end the JVM: its code is the run's, and
 * whatever the tool prints after it (a catch (Throwable) reporting the ToolExit) is dropped.
 *
 * <p>Requests on stdin, one JSON object per line: {"main": CLASS, "args": [...], "stdin": TEXT};
 * one JSON line answers each: {"code": N, "stdout": TEXT, "stderr": TEXT}. For tools that keep
 * static state between runs (the console producer and consumer), start a JVM of their own.
 */
public final class ToolRunner {
    /** Thrown by Exit.exit(): an Error, so that the tools' catch (Exception) blocks let it by. */
    private static final class ToolExit extends Error {
        final int code;

        ToolExit(int code) {
            super(null, null, false, false);
            this.code = code;
        }
    }

    /** The first exit code of the current run, or null while it has not exited. */
    private static Integer exited;

    /** Whether a tool runs now: System.exit() then ends the tool's run, not the JVM. */
    private static volatile boolean running;

    private static void exit(int code) {
        if (exited == null) {
            exited = code;
            PrintStream gone = new PrintStream(OutputStream.nullOutputStream());
            System.setOut(gone);
            System.setErr(gone);
        }
        throw new ToolExit(code);
    }

    /**
     * System.exit() ends the running tool's run, not the JVM: the one hook on it before Java 24
     * is a SecurityManager (the JVM runs with -Djava.security.manager=allow). Without one, a
     * tool calling System.exit() ends the runner, which its caller sees.
     */
    @SuppressWarnings("removal")
    private static void trapSystemExit(PrintStream err) {
        try {
            System.setSecurityManager(new SecurityManager() {
                @Override
                public void checkPermission(Permission permission) {}

                @Override
                public void checkPermission(Permission permission, Object context) {}

                @Override
                public void checkExit(int status) {
                    if (running) {
                        exit(status);
                    }
                }
            });
        } catch (UnsupportedOperationException e) {
            err.println("ToolRunner: no SecurityManager on this Java; System.exit() ends the runner");
        }
    }

    public static void main(String[] args) throws Exception {
        ObjectMapper json = new ObjectMapper();
        PrintStream out = System.out;
        PrintStream err = System.err;
        InputStream in = System.in;
        Exit.setExitProcedure((code, message) -> exit(code));
        Exit.setHaltProcedure((code, message) -> exit(code));
        trapSystemExit(err);
        BufferedReader requests = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8));
        String line;
        while ((line = requests.readLine()) != null) {
            JsonNode request = json.readTree(line);
            String[] toolArgs = new String[request.get("args").size()];
            for (int i = 0; i < toolArgs.length; i++) {
                toolArgs[i] = request.get("args").get(i).asText();
            }
            byte[] stdin = request.path("stdin").asText("").getBytes(StandardCharsets.UTF_8);
            ByteArrayOutputStream toolOut = new ByteArrayOutputStream();
            ByteArrayOutputStream toolErr = new ByteArrayOutputStream();
            System.setOut(new PrintStream(toolOut, true, StandardCharsets.UTF_8));
            System.setErr(new PrintStream(toolErr, true, StandardCharsets.UTF_8));
            System.setIn(new ByteArrayInputStream(stdin));
            PrintStream toolErrStream = System.err;
            exited = null;
            running = true;
            int code = 0;
            try {
                Class.forName(request.get("main").asText())
                        .getMethod("main", String[].class)
                        .invoke(null, (Object) toolArgs);
            } catch (InvocationTargetException e) {
                if (exited == null) {
                    // what the JVM does with an exception out of main: print it, exit 1
                    e.getCause().printStackTrace(toolErrStream);
                    code = 1;
                }
            } finally {
                running = false;
                if (exited != null) {
                    code = exited;
                }
                System.out.flush();
                System.err.flush();
                System.setOut(out);
                System.setErr(err);
                System.setIn(in);
            }
            ObjectNode response = json.createObjectNode();
            response.put("code", code);
            response.put("stdout", toolOut.toString(StandardCharsets.UTF_8));
            response.put("stderr", toolErr.toString(StandardCharsets.UTF_8));
            out.println(json.writeValueAsString(response));
            out.flush();
        }
        // end of input: stop, whatever threads a tool left behind
        System.exit(0);
    }
}
