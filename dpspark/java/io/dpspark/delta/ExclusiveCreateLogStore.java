/*
 * dpspark: a Delta Lake LogStore whose commits are exclusive between drivers.
 *
 * Delta's optimistic concurrency needs one thing from the storage: writing the commit file
 * _delta_log/<version>.json must fail, atomically, when that file already exists. Otherwise two
 * drivers that commit the same version both "succeed" and one commit is silently lost (for the
 * privacy ledger: a charge that never happened). Delta's default stores give that within one JVM
 * (a lock) but not between drivers on S3 (exists-then-PUT) nor on a local disk (exists-then-rename,
 * and a local rename replaces its target).
 *
 * This store creates a new commit file in one atomic step on each storage it serves:
 *  - s3a://: a conditional PUT (If-None-Match: *), through Hadoop 3.5's createFile() option
 *    fs.option.create.conditional.overwrite, required with must(): a store or a setting
 *    (fs.s3a.create.conditional.enabled=false) that cannot honour it fails the commit, never
 *    writes it unconditionally. A 412 (or 409, a concurrent conditional write) answer is the
 *    FileAlreadyExistsException Delta expects, and Delta retries on the new version.
 *    existsAnswer() decides "already exists" from the answer itself, never from an error's text
 *    (version 412's file is 00000000000000000412.json: an I/O error naming it must stay an error,
 *    or Delta would retry a commit that may have been written, charging the ledger twice). Walking
 *    the cause chain, an error is "already exists" when one link
 *      - has a public no-arg statusCode() (the AWS SDK v2's AwsServiceException/S3Exception,
 *        hadoop-aws's AWSServiceIOException/AWSS3IOException; called reflectively, so this class
 *        compiles against delta-storage and hadoop-client-api only) answering 412 or 409;
 *      - is hadoop-aws's RemoteFileChangedException (by class name), S3A's translation of a 412
 *        and of an error response whose AWS error code is PreconditionFailed (status 200, e.g. a
 *        multipart completion); or
 *      - has awsErrorDetails().errorCode() (reflectively) equal to exactly "PreconditionFailed" or
 *        "ConditionalRequestConflict", S3's error codes for those answers.
 *    Anything else (another status, an error without one, a message that merely mentions 412) is
 *    rethrown as it is.
 *  - file:: the content goes to a temporary file beside the target, then a hard link to the
 *    target name (link(2) fails with EEXIST when the target exists).
 * Any other scheme is refused (UnsupportedOperationException): configure it for s3a and file only.
 * The content is buffered first, so nothing partial is ever visible. Reads and listings are
 * HadoopFileSystemLogStore's (S3 and local listings are strongly consistent).
 *
 * Built into dpspark/jars/dpspark-logstore.jar by scripts/build_logstore.sh (javac --release 17
 * against delta-storage and Spark's Hadoop client); tests/test_object_store.py checks the jar was
 * built from this source.
 */
package io.dpspark.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Iterator;
import java.util.UUID;

public class ExclusiveCreateLogStore extends HadoopFileSystemLogStore {

    static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

    public ExclusiveCreateLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    private static byte[] content(Iterator<String> actions) {
        ByteArrayOutputStream buffer = new ByteArrayOutputStream();
        while (actions.hasNext()) {
            byte[] line = (actions.next() + "\n").getBytes(StandardCharsets.UTF_8);
            buffer.write(line, 0, line.length);
        }
        return buffer.toByteArray();
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        String scheme = fs.getScheme();
        byte[] bytes = content(actions);
        if ("s3a".equals(scheme)) {
            if (overwrite) {
                try (FSDataOutputStream out = fs.create(path, true)) {
                    out.write(bytes);
                }
                return;
            }
            try {
                FSDataOutputStream out =
                    (FSDataOutputStream) fs.createFile(path).overwrite(true).must(CONDITIONAL_CREATE, true).build();
                out.write(bytes);
                out.close();
            } catch (IOException e) {
                if (existsAnswer(e)) {
                    throw new FileAlreadyExistsException(path.toString());
                }
                throw e;
            }
        } else if ("file".equals(scheme)) {
            java.nio.file.Path target = Paths.get(fs.makeQualified(path).toUri());
            java.nio.file.Path temp = target.resolveSibling("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
            Files.createDirectories(target.getParent());
            Files.write(temp, bytes);
            try {
                if (overwrite) {
                    Files.move(temp, target, java.nio.file.StandardCopyOption.REPLACE_EXISTING,
                               java.nio.file.StandardCopyOption.ATOMIC_MOVE);
                } else {
                    Files.createLink(target, temp);  // EEXIST: java.nio.file.FileAlreadyExistsException
                }
            } finally {
                Files.deleteIfExists(temp);
            }
        } else {
            throw new UnsupportedOperationException(
                "io.dpspark.delta.ExclusiveCreateLogStore serves s3a:// and file: paths only, not " + path);
        }
    }

    /** HTTP answers to a conditional PUT that mean "the commit file exists": 412 Precondition Failed, 409 Conflict. */
    static boolean existsStatus(int status) {
        return status == 412 || status == 409;
    }

    /** S3's error codes for those answers (compared whole, never searched for in a message). */
    static boolean existsErrorCode(String code) {
        return "PreconditionFailed".equals(code) || "ConditionalRequestConflict".equals(code);
    }

    /**
     * True when the conditional create failed because the commit file exists (see the header): a link
     * of the cause chain with a 412/409 statusCode(), a RemoteFileChangedException, or the exact AWS
     * error code PreconditionFailed/ConditionalRequestConflict. Never decided from message text.
     */
    public static boolean existsAnswer(Throwable error) {
        java.util.Set<Throwable> seen = java.util.Collections.newSetFromMap(new java.util.IdentityHashMap<>());
        for (Throwable t = error; t != null && seen.add(t); t = t.getCause()) {
            if (t.getClass().getName().equals("org.apache.hadoop.fs.s3a.RemoteFileChangedException")) {
                return true;
            }
            Object status = callNoArg(t, "statusCode");
            if (status instanceof Integer && existsStatus((Integer) status)) {
                return true;
            }
            Object details = callNoArg(t, "awsErrorDetails");
            Object code = details == null ? null : callNoArg(details, "errorCode");
            if (code instanceof String && existsErrorCode((String) code)) {
                return true;
            }
        }
        return false;
    }

    /** The result of target's public no-arg instance method {@code name}, or null if it has none or it fails. */
    private static Object callNoArg(Object target, String name) {
        try {
            java.lang.reflect.Method method = target.getClass().getMethod(name);
            if (java.lang.reflect.Modifier.isStatic(method.getModifiers())) {
                return null;
            }
            return method.invoke(target);
        } catch (ReflectiveOperationException | RuntimeException | LinkageError e) {
            return null;
        }
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
        return false;
    }
}
